"""The Triton KV write and paged attention kernels against a float64 reference.

Every case builds whole per-request key/value sequences, scatters them into a
NaN-poisoned paged cache through shuffled block tables, and compares the kernel
with plain ``softmax(q k^T) v`` over the unpaged sequences. On a CPU machine the
kernels run in Triton's interpreter (see conftest.py); the ``cuda`` variants run
natively and skip without a CUDA device.
"""
from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import triton
from hydra.utils import instantiate

from minivllm.attention import AttentionMetadata
from minivllm.attention.ops import paged_attention, triton_kv_write, triton_paged_attention, write_kv
from minivllm.attention.ops.triton_paged_attention import default_num_splits
from minivllm.attention.triton_backend import TritonAttentionBackend

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="CPU runs need TRITON_INTERPRET=1")),
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
]
ANY_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {  # dtype -> (atol, rtol); 16-bit outputs and probabilities are rounded
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1e-2, 1e-2),
}


@dataclass(frozen=True)
class Case:
    seq_lens: tuple[int, ...]
    """Tokens per request after this step (cached + new)."""
    query_lens: tuple[int, ...]
    """New tokens per request: the last ``query_lens[i]`` of ``seq_lens[i]``."""
    block_size: int = 16
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    dtype: torch.dtype = torch.float32
    sliding_window: int | None = None
    soft_cap: float | None = None
    num_pad: int = 0
    """Padding tokens appended to the batch (slot -1, past query_start_loc[-1])."""
    num_splits: int | None = None
    """KV splits to force (None: the wrapper's choice, no split on the CPU)."""


@dataclass
class Batch:
    case: Case
    query: torch.Tensor  # (T, H, D)
    new_key: torch.Tensor  # (T, Hkv, D), views into a fused qkv tensor
    new_value: torch.Tensor  # (T, Hkv, D)
    keys: list[torch.Tensor]  # per request (seq_len, Hkv, D): the whole sequence
    values: list[torch.Tensor]
    slots: list[torch.Tensor]  # per request (seq_len,) int64: slot of every position
    kv_cache: torch.Tensor  # (2, num_blocks, block_size, Hkv, D), NaN but for cached tokens
    meta: AttentionMetadata


def param(name: str, *seq_and_query_lens: tuple[int, int], **fields):
    seq_lens, query_lens = zip(*seq_and_query_lens)
    return pytest.param(Case(seq_lens, query_lens, **fields), id=name)


def block_boundary_cases(bs: int) -> list:
    """Lengths ending just before, on and just after block boundaries."""
    return [
        param(f"decode-bs{bs}", (bs - 1, 1), (bs, 1), (bs + 1, 1), (2 * bs, 1), block_size=bs),
        # decode past a boundary | chunk resuming mid-block, ending on a boundary |
        # prefill ending before a boundary | short prefill | chunk crossing one
        param(f"mixed-bs{bs}", (bs + 1, 1), (2 * bs, bs // 2 + 3), (bs - 1, bs - 1), (5, 5),
              (2 * bs + 1, bs), block_size=bs),
    ]


CASES = [
    *(c for bs in (8, 16, 32, 64) for c in block_boundary_cases(bs)),
    *(param(f"head{d}-{str(dt)[6:]}", (9, 1), (20, 6), head_dim=d, dtype=dt)
      for d, dt in ((64, torch.float32), (80, torch.bfloat16), (96, torch.float16),
                    (128, torch.float32), (256, torch.bfloat16))),
    *(param(f"heads{h}-kv{kv}", (17, 1), (12, 7), (3, 3), num_heads=h, num_kv_heads=kv, block_size=8)
      for h, kv in ((4, 4), (4, 2), (8, 2), (6, 2), (8, 1))),
    param("mixed-fp16", (33, 1), (40, 9), (7, 7), num_heads=8, dtype=torch.float16),
    param("mixed-bf16", (33, 1), (40, 9), (7, 7), num_heads=8, dtype=torch.bfloat16),
    param("decode-bf16", (31, 1), (1, 1), (48, 1), num_heads=8, dtype=torch.bfloat16),
    param("multi-tile-prefill", (75, 70), (3, 1), num_heads=8),
    param("window5", (30, 1), (19, 12), (4, 4), (40, 40), block_size=8, sliding_window=5),
    param("window1", (10, 1), (6, 3), block_size=8, sliding_window=1),
    param("window16-fp16", (40, 1), (21, 9), (9, 9), sliding_window=16, dtype=torch.float16),
    param("softcap", (26, 1), (19, 11), (8, 8), block_size=8, soft_cap=1.5),
    param("softcap-window-bf16", (26, 1), (19, 11), block_size=8, soft_cap=2.0, sliding_window=7,
          dtype=torch.bfloat16),
    # Split-KV: split lengths round up to whole key tiles, so short requests leave splits empty.
    param("split4-decode", (200, 1), (65, 1), (9, 1), (64, 1), num_splits=4),  # 64-key splits
    param("split2-window", (120, 1), (70, 1), block_size=8, sliding_window=50, num_splits=2),  # window spans both
    param("split8-mixed-softcap-bf16", (90, 20), (200, 1), (20, 20), soft_cap=2.0, dtype=torch.bfloat16,
          num_splits=8),
    param("split4-mqa-head80-fp16", (150, 1), (33, 1), num_heads=8, num_kv_heads=1, head_dim=80,
          dtype=torch.float16, num_splits=4),
]


def make_batch(case: Case, device: str, seed: int = 0) -> Batch:
    """Random inputs (never zeros) and a cache whose blocks are scattered at random."""
    gen = torch.Generator().manual_seed(seed)
    bs, hkv, d = case.block_size, case.num_kv_heads, case.head_dim

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(case.dtype)

    blocks_per_req = [math.ceil(s / bs) for s in case.seq_lens]
    num_blocks = sum(blocks_per_req) + 3  # a few spare blocks stay NaN
    block_ids = torch.randperm(num_blocks, generator=gen)[: sum(blocks_per_req)].split(blocks_per_req)
    block_tables = torch.zeros(len(case.seq_lens), max(blocks_per_req) + 1, dtype=torch.int32)
    keys, values, slots = [], [], []
    kv_cache = torch.full((2, num_blocks * bs, hkv, d), float("nan"), dtype=case.dtype)  # slot-major view
    for i, (seq_len, q_len) in enumerate(zip(case.seq_lens, case.query_lens)):
        block_tables[i, : len(block_ids[i])] = block_ids[i]
        pos = torch.arange(seq_len)
        slots.append(block_ids[i][pos // bs] * bs + pos % bs)
        keys.append(randn(seq_len, hkv, d))
        values.append(randn(seq_len, hkv, d))
        cached = slots[-1][: seq_len - q_len]
        kv_cache[0, cached], kv_cache[1, cached] = keys[-1][: seq_len - q_len], values[-1][: seq_len - q_len]

    num_tokens = sum(case.query_lens) + case.num_pad
    qkv = randn(num_tokens, case.num_heads + 2 * hkv, d)  # fused projection output
    query, new_key, new_value = qkv.split([case.num_heads, hkv, hkv], dim=1)
    new_key[: num_tokens - case.num_pad] = torch.cat([k[-q:] for k, q in zip(keys, case.query_lens)])
    new_value[: num_tokens - case.num_pad] = torch.cat([v[-q:] for v, q in zip(values, case.query_lens)])
    slot_mapping = torch.cat([s[-q:] for s, q in zip(slots, case.query_lens)] + [torch.full((case.num_pad,), -1)])
    query_lens = torch.tensor(case.query_lens)
    meta = AttentionMetadata(
        slot_mapping=slot_mapping.to(device),
        query_start_loc=torch.cat([torch.zeros(1, dtype=torch.long), query_lens.cumsum(0)]).to(torch.int32).to(device),
        seq_lens=torch.tensor(case.seq_lens, dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        max_query_len=max(case.query_lens), max_seq_len=max(case.seq_lens),
        query_lens_cpu=list(case.query_lens), seq_lens_cpu=list(case.seq_lens),
    )
    return Batch(case, query.to(device), new_key.to(device), new_value.to(device),
                 [k.to(device) for k in keys], [v.to(device) for v in values], [s.to(device) for s in slots],
                 kv_cache.view(2, num_blocks, bs, hkv, d).to(device), meta)


def expected_cache(batch: Batch, cache: torch.Tensor) -> torch.Tensor:
    """``cache`` with every token of every request stored at its slot, one by one."""
    out = cache.clone()
    bs = batch.case.block_size
    for k, v, slots in zip(batch.keys, batch.values, batch.slots):
        for pos, slot in enumerate(slots.tolist()):
            out[0, slot // bs, slot % bs] = k[pos]
            out[1, slot // bs, slot % bs] = v[pos]
    return out


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, case: Case) -> torch.Tensor:
    """One request in float64: q (L, H, D), k/v (S, Hkv, D) -> (L, H, D)."""
    q_len, seq_len = q.shape[0], k.shape[0]
    group = case.num_heads // case.num_kv_heads
    k = k.double().repeat_interleave(group, dim=1)  # (S, H, D): head h reads KV head h // group
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) / math.sqrt(case.head_dim)
    if case.soft_cap is not None:
        scores = case.soft_cap * torch.tanh(scores / case.soft_cap)
    q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
    k_pos = torch.arange(seq_len, device=q.device)[None, :]
    visible = k_pos <= q_pos
    if case.sliding_window is not None:
        visible &= q_pos - k_pos < case.sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def reference_batch(batch: Batch) -> torch.Tensor:
    """(T_real, H, D) float64: every request's queries against its whole sequence."""
    queries = batch.query.split(list(batch.case.query_lens) + [batch.case.num_pad])
    return torch.cat([reference_attention(q, k, v, batch.case) for q, k, v in zip(queries, batch.keys, batch.values)])


def run_attention(batch: Batch, kv_cache: torch.Tensor) -> torch.Tensor:
    """The kernel into a NaN-poisoned output buffer."""
    out = torch.full_like(batch.query, float("nan"))
    result = paged_attention(
        batch.query, kv_cache, batch.meta.query_start_loc, batch.meta.seq_lens, batch.meta.block_tables,
        max_query_len=batch.meta.max_query_len, max_seq_len=batch.meta.max_seq_len,
        scale=1 / math.sqrt(batch.case.head_dim), sliding_window=batch.case.sliding_window,
        logits_soft_cap=batch.case.soft_cap, out=out, num_splits=batch.case.num_splits,
    )
    assert result is out
    return out


def assert_matches_reference(out: torch.Tensor, batch: Batch) -> None:
    num_real = out.shape[0] - batch.case.num_pad
    assert not out[:num_real].isnan().any(), "some output elements were never written"
    atol, rtol = TOLERANCE[batch.case.dtype]
    torch.testing.assert_close(out[:num_real].double(), reference_batch(batch), atol=atol, rtol=rtol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_paged_attention_matches_reference(case: Case, device: str) -> None:
    batch = make_batch(case, device)
    out = run_attention(batch, expected_cache(batch, batch.kv_cache))
    assert_matches_reference(out, batch)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_splits", [1, 4])
def test_padding_rows_are_left_untouched(num_splits: int, device: str) -> None:
    batch = make_batch(Case((12, 130), (1, 1), num_pad=3, num_splits=num_splits), device)
    out = run_attention(batch, expected_cache(batch, batch.kv_cache))
    assert_matches_reference(out, batch)
    assert out[-3:].isnan().all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [
    param("bs8-fp32", (9, 1), (17, 9), (3, 3), block_size=8, num_kv_heads=3, num_heads=6, head_dim=80, num_pad=2),
    param("bs16-bf16", (33, 1), (20, 14), num_kv_heads=1, dtype=torch.bfloat16, num_pad=1),
    param("bs32-fp16", (31, 31), (40, 2), block_size=32, head_dim=96, dtype=torch.float16),
])
def test_write_kv_fills_exactly_the_new_slots(case: Case, device: str) -> None:
    batch = make_batch(case, device)
    before = batch.kv_cache.clone()
    write_kv(batch.new_key, batch.new_value, batch.kv_cache, batch.meta.slot_mapping)
    # NaN slots must stay NaN, cached tokens keep their values, new tokens land bit-exactly.
    torch.testing.assert_close(batch.kv_cache, expected_cache(batch, before), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [
    param("mixed-gqa4", (33, 1), (20, 14), (5, 5), num_heads=8, block_size=8, num_pad=2),
    param("window-softcap-bf16", (26, 1), (19, 11), soft_cap=2.0, sliding_window=7, dtype=torch.bfloat16),
])
def test_backend_writes_then_attends(case: Case, device: str) -> None:
    batch = make_batch(case, device)
    before = batch.kv_cache.clone()
    out = TritonAttentionBackend().forward(
        batch.query, batch.new_key, batch.new_value, batch.kv_cache, batch.meta,
        scale=1 / math.sqrt(case.head_dim), sliding_window=case.sliding_window, logits_soft_cap=case.soft_cap,
    )
    assert out.shape == batch.query.shape and out.dtype == case.dtype
    torch.testing.assert_close(batch.kv_cache, expected_cache(batch, before), rtol=0, atol=0, equal_nan=True)
    assert_matches_reference(out, batch)


def test_backend_is_a_hydra_target() -> None:
    backend = instantiate({"_target_": "minivllm.attention.triton_backend.TritonAttentionBackend"})
    assert isinstance(backend, TritonAttentionBackend) and backend.name == "triton"


@pytest.mark.parametrize(("num_sms", "programs", "max_query_len", "max_seq_len", "expected"), [
    (132, 8, 1, 4096, 16),  # one request, 8 KV heads: as many splits as allowed
    (132, 8, 1, 600, 2),  # short context: splits of >= 256 keys
    (132, 64, 1, 4096, 8),
    (132, 512, 1, 4096, 1),  # the batch fills the GPU already
    (132, 8, 7, 4096, 1),  # prefill work in the batch
])
def test_default_num_splits(num_sms: int, programs: int, max_query_len: int, max_seq_len: int,
                            expected: int) -> None:
    assert default_num_splits(num_sms, programs, max_query_len, max_seq_len) == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", [
    param("mixed", (1000, 1), (2049, 1), (4096, 1), (1500, 700), (300, 300)),
    param("decode-split-by-default", (4000, 1), (3000, 1)),
])
def test_realistic_batch_on_gpu(case: Case) -> None:
    """Long contexts and large chunks: sizes the interpreter cannot afford."""
    case = dataclasses.replace(case, num_heads=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    batch = make_batch(case, "cuda")
    assert_matches_reference(run_attention(batch, expected_cache(batch, batch.kv_cache)), batch)


BAD_INPUTS = {  # name -> (function of a valid batch that breaks one thing, expected message)
    "seq_lens-int64": (lambda b: dict(seq_lens=b.meta.seq_lens.long()), "seq_lens must be int32"),
    "query_start_loc-len": (lambda b: dict(query_start_loc=b.meta.query_start_loc[:-1]),
                            r"query_start_loc must be \(B \+ 1,\)"),
    "block_tables-rows": (lambda b: dict(block_tables=b.meta.block_tables[:1]), "block_tables must have B = 2 rows"),
    "head_dim": (lambda b: dict(query=b.query[..., :32]), "head_dim"),
    "heads-not-multiple": (lambda b: dict(query=b.query[:, :3]), "multiple of the cache's num_kv_heads"),
    "query-stride": (lambda b: dict(query=b.query.transpose(1, 2).contiguous().transpose(1, 2)), "unit stride"),
    "cache-dtype": (lambda b: dict(kv_cache=b.kv_cache.half()), "kv_cache dtype"),
    "out-shape": (lambda b: dict(out=b.query[:-1].clone()), "out must be"),
    "window": (lambda b: dict(sliding_window=0), "sliding_window must be > 0"),
    "max_seq_len": (lambda b: dict(max_seq_len=2), "max_query_len <= max_seq_len"),
    "num_splits": (lambda b: dict(num_splits=3), "num_splits must be a power of two"),
}


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_paged_attention_rejects_bad_inputs(name: str) -> None:
    batch = make_batch(Case((5, 9), (1, 3)), ANY_DEVICE)
    break_input, message = BAD_INPUTS[name]
    args = dict(query=batch.query, kv_cache=batch.kv_cache, query_start_loc=batch.meta.query_start_loc,
                seq_lens=batch.meta.seq_lens, block_tables=batch.meta.block_tables)
    kwargs = dict(max_query_len=3, max_seq_len=9, scale=0.125)
    for key, value in break_input(batch).items():
        (args if key in args else kwargs)[key] = value
    with pytest.raises(ValueError, match=message):
        paged_attention(*args.values(), **kwargs)


def test_write_kv_rejects_bad_inputs() -> None:
    batch = make_batch(Case((5, 9), (1, 3)), ANY_DEVICE)
    k, v, cache, slots = batch.new_key, batch.new_value, batch.kv_cache, batch.meta.slot_mapping
    with pytest.raises(ValueError, match="slot_mapping must be"):
        write_kv(k, v, cache, slots[:-1])
    with pytest.raises(ValueError, match="kv_cache has 2 KV heads, inputs have 1"):
        write_kv(k[:, :1], v[:, :1], cache, slots)
    with pytest.raises(ValueError, match="kv_cache dtype"):
        write_kv(k.half(), v.half(), cache, slots)


def kernel_signature(kernel, dtype: str, constexprs: dict, kv_dtype: str | None = None) -> dict[str, str]:
    """Triton argument types, by our kernels' naming conventions (``kv_dtype``: the cache's, if not ``dtype``)."""
    index_ptrs = {"block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "query_start_loc_ptr": "*i32",
                  "slot_mapping_ptr": "*i64"}

    def arg_type(name: str) -> str:
        if name in constexprs:
            return "constexpr"
        if name in index_ptrs:
            return index_ptrs[name]
        if name == "kv_ptr" and kv_dtype is not None:
            return f"*{kv_dtype}"
        if name.endswith("_ptr"):
            return "*fp32" if name.startswith("part_") else f"*{dtype}"
        return "fp32" if name in ("scale", "soft_cap", "k_scale", "v_scale") else "i32"

    return {name: arg_type(name) for name in kernel.arg_names}


COMPILED_VARIANTS = [  # dtype, head_dim, group, max_query_len, num_splits, block_size, window, soft-cap
    ("bf16", 128, 4, 1, 4, 16, True, True),
    ("fp16", 80, 3, 64, 1, 8, False, False),
    ("fp32", 256, 1, 64, 1, 64, True, False),
]
FP8_KV_VARIANTS = [  # the same, over a float8_e4m3fn cache
    ("bf16", 128, 4, 1, 4, 16, False, False),
    ("fp16", 64, 2, 64, 1, 16, False, False),
]


def compile_kernels_for_cuda(arch: int = 90) -> None:
    """Compile the kernels as the wrappers configure them for sm_<arch>, down to a
    cubin with the ptxas that ships with Triton: no GPU needed. Run this without
    TRITON_INTERPRET (the kernels must be JITFunctions)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def build(kernel, dtype: str, num_warps: int = 4, kv_dtype: str | None = None, **constexprs) -> None:
        # As at a real launch: pointers and (typical) strides are multiples of 16.
        aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
                   if name.endswith("_ptr") or name.startswith("stride_")}
        source = ASTSource(kernel, kernel_signature(kernel, dtype, constexprs, kv_dtype), constexprs, aligned)
        triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})

    for i, (dtype, head_dim, group, max_query_len, splits, block_size, window, soft_cap) in enumerate(
            COMPILED_VARIANTS + FP8_KV_VARIANTS):
        fp8_kv = i >= len(COMPILED_VARIANTS)
        group_pad = triton.next_power_of_2(group)
        block_q, block_n, num_warps = triton_paged_attention._tile_config(head_dim, group_pad, max_query_len,
                                                                          fp32=dtype == "fp32")
        build(triton_paged_attention._paged_attention_kernel, dtype, num_warps, kv_dtype="fp8e4nv" if fp8_kv else None,
              HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_SIZE=block_size,
              GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, BLOCK_N=block_n, NUM_SPLITS=splits,
              USE_WINDOW=window, USE_SOFT_CAP=soft_cap, FP32_DOT=dtype == "fp32", FP8_KV=fp8_kv)
    build(triton_paged_attention._combine_splits_kernel, "bf16", HEAD_DIM=80, BLOCK_D=128, NUM_SPLITS=4)
    for fp8 in (False, True):
        build(triton_kv_write._write_kv_kernel, "bf16", kv_dtype="fp8e4nv" if fp8 else None, NUM_KV_HEADS=3,
              HEAD_DIM=80, BLOCK_H=4, BLOCK_D=128, BLOCK_SIZE=16, FP8=fp8, ROUND_FP8=False)


@pytest.mark.slow
def test_kernels_compile_for_cuda_without_a_gpu() -> None:
    """The interpreter runs code that Triton's compiler rejects (a plain float global,
    say), so the CPU run also compiles every kernel for a Hopper GPU, in a fresh
    process where the kernels are defined without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    here = Path(__file__).resolve().parent
    env["PYTHONPATH"] = os.pathsep.join([str(here), str(here.parents[1]), env.get("PYTHONPATH", "")])
    code = f"import {Path(__file__).stem} as t; t.compile_kernels_for_cuda(90)"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
