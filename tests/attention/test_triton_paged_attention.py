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
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate

from minivllm.attention import AttentionMetadata
from minivllm.attention.ops import paged_attention, write_kv
from minivllm.attention.ops import triton_paged_attention as pa
from minivllm.attention.ops.checks import check_fp8_kv_capability
from minivllm.attention.ops.paged_attention_tiles import default_num_splits, tile_config
from minivllm.attention.triton_backend import TritonAttentionBackend

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="CPU runs need TRITON_INTERPRET=1")),
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
    ),
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
        param(
            f"mixed-bs{bs}",
            (bs + 1, 1),
            (2 * bs, bs // 2 + 3),
            (bs - 1, bs - 1),
            (5, 5),
            (2 * bs + 1, bs),
            block_size=bs,
        ),
    ]


CASES = [
    *(c for bs in (8, 16, 32, 64) for c in block_boundary_cases(bs)),
    *(
        param(f"head{d}-{str(dt)[6:]}", (9, 1), (20, 6), head_dim=d, dtype=dt)
        for d, dt in (
            (64, torch.float32),
            (80, torch.bfloat16),
            (96, torch.float16),
            (128, torch.float32),
            (256, torch.bfloat16),
        )
    ),
    *(
        param(f"heads{h}-kv{kv}", (17, 1), (12, 7), (3, 3), num_heads=h, num_kv_heads=kv, block_size=8)
        for h, kv in ((4, 4), (4, 2), (8, 2), (6, 2), (8, 1))
    ),
    param("mixed-fp16", (33, 1), (40, 9), (7, 7), num_heads=8, dtype=torch.float16),
    param("mixed-bf16", (33, 1), (40, 9), (7, 7), num_heads=8, dtype=torch.bfloat16),
    param("decode-bf16", (31, 1), (1, 1), (48, 1), num_heads=8, dtype=torch.bfloat16),
    param("multi-tile-prefill", (75, 70), (3, 1), num_heads=8),
    param("window5", (30, 1), (19, 12), (4, 4), (40, 40), block_size=8, sliding_window=5),
    param("window1", (10, 1), (6, 3), block_size=8, sliding_window=1),
    param("window16-fp16", (40, 1), (21, 9), (9, 9), sliding_window=16, dtype=torch.float16),
    param("softcap", (26, 1), (19, 11), (8, 8), block_size=8, soft_cap=1.5),
    param("softcap-window-bf16", (26, 1), (19, 11), block_size=8, soft_cap=2.0, sliding_window=7, dtype=torch.bfloat16),
    # Split-KV: split lengths round up to whole key tiles, so short requests leave splits empty.
    param("split4-decode", (200, 1), (65, 1), (9, 1), (64, 1), num_splits=4),  # 64-key splits
    param("split2-window", (120, 1), (70, 1), block_size=8, sliding_window=50, num_splits=2),  # window spans both
    param("split8-mixed-softcap-bf16", (90, 20), (200, 1), (20, 20), soft_cap=2.0, dtype=torch.bfloat16, num_splits=8),
    param(
        "split4-mqa-head80-fp16",
        (150, 1),
        (33, 1),
        num_heads=8,
        num_kv_heads=1,
        head_dim=80,
        dtype=torch.float16,
        num_splits=4,
    ),
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
        max_query_len=max(case.query_lens),
        max_seq_len=max(case.seq_lens),
        query_lens_cpu=list(case.query_lens),
        seq_lens_cpu=list(case.seq_lens),
    )
    return Batch(
        case,
        query.to(device),
        new_key.to(device),
        new_value.to(device),
        [k.to(device) for k in keys],
        [v.to(device) for v in values],
        [s.to(device) for s in slots],
        kv_cache.view(2, num_blocks, bs, hkv, d).to(device),
        meta,
    )


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
        batch.query,
        kv_cache,
        batch.meta.query_start_loc,
        batch.meta.seq_lens,
        batch.meta.block_tables,
        max_query_len=batch.meta.max_query_len,
        max_seq_len=batch.meta.max_seq_len,
        scale=1 / math.sqrt(batch.case.head_dim),
        sliding_window=batch.case.sliding_window,
        logits_soft_cap=batch.case.soft_cap,
        out=out,
        num_splits=batch.case.num_splits,
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
@pytest.mark.parametrize(
    "case",
    [
        param("bs8-fp32", (9, 1), (17, 9), (3, 3), block_size=8, num_kv_heads=3, num_heads=6, head_dim=80, num_pad=2),
        param("bs16-bf16", (33, 1), (20, 14), num_kv_heads=1, dtype=torch.bfloat16, num_pad=1),
        param("bs32-fp16", (31, 31), (40, 2), block_size=32, head_dim=96, dtype=torch.float16),
    ],
)
def test_write_kv_fills_exactly_the_new_slots(case: Case, device: str) -> None:
    batch = make_batch(case, device)
    before = batch.kv_cache.clone()
    write_kv(batch.new_key, batch.new_value, batch.kv_cache, batch.meta.slot_mapping)
    # NaN slots must stay NaN, cached tokens keep their values, new tokens land bit-exactly.
    torch.testing.assert_close(batch.kv_cache, expected_cache(batch, before), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "case",
    [
        param("mixed-gqa4", (33, 1), (20, 14), (5, 5), num_heads=8, block_size=8, num_pad=2),
        param("window-softcap-bf16", (26, 1), (19, 11), soft_cap=2.0, sliding_window=7, dtype=torch.bfloat16),
    ],
)
def test_backend_writes_then_attends(case: Case, device: str) -> None:
    batch = make_batch(case, device)
    before = batch.kv_cache.clone()
    out = TritonAttentionBackend().forward(
        batch.query,
        batch.new_key,
        batch.new_value,
        batch.kv_cache,
        batch.meta,
        scale=1 / math.sqrt(case.head_dim),
        sliding_window=case.sliding_window,
        logits_soft_cap=case.soft_cap,
    )
    assert out.shape == batch.query.shape and out.dtype == case.dtype
    torch.testing.assert_close(batch.kv_cache, expected_cache(batch, before), rtol=0, atol=0, equal_nan=True)
    assert_matches_reference(out, batch)


def test_backend_is_a_hydra_target() -> None:
    backend = instantiate({"_target_": "minivllm.attention.triton_backend.TritonAttentionBackend"})
    assert isinstance(backend, TritonAttentionBackend) and backend.name == "triton"


@pytest.mark.parametrize(
    ("num_sms", "programs", "max_query_len", "max_seq_len", "expected"),
    [
        (132, 8, 1, 4096, 16),  # one request, 8 KV heads: as many splits as allowed
        (132, 8, 1, 1100, 4),  # splits of >= 256 keys
        (132, 8, 1, 1023, 1),  # a short context: one launch, no combine pass
        (132, 1, 1, 1023, 1),
        (132, 64, 1, 4096, 8),
        (132, 512, 1, 4096, 1),  # the batch fills the GPU already
        (132, 8, 7, 4096, 1),  # prefill work in the batch
    ],
)
def test_default_num_splits(num_sms: int, programs: int, max_query_len: int, max_seq_len: int, expected: int) -> None:
    assert default_num_splits(num_sms, programs, max_query_len, max_seq_len) == expected


SM80, SM90 = (8, 0), (9, 0)


@pytest.mark.parametrize(
    ("head_dim", "group_pad", "max_query_len", "fp32", "sm90", "sm80"),
    [
        (128, 2, 512, False, (32, 64, 4), (32, 32, 4)),  # bf16/fp16 prefill: half the keys per step on sm_8x
        (80, 4, 64, False, (16, 64, 4), (16, 32, 4)),
        (128, 1, 64, True, (32, 32, 4), (32, 16, 4)),  # fp32 prefill
        (256, 1, 64, True, (16, 32, 8), (16, 16, 8)),  # fp32 head_dim 256, prefill and decode
        (256, 1, 1, True, (16, 32, 8), (16, 16, 8)),
        (128, 4, 1, False, (4, 64, 4), (4, 64, 4)),  # decode: the same tiles
        (128, 1, 1, True, (16, 32, 4), (16, 32, 4)),
        (256, 2, 64, False, (16, 32, 8), (16, 32, 8)),  # bf16 head_dim 256 prefill: the same
    ],
)
def test_tile_config_per_architecture(
    head_dim: int, group_pad: int, max_query_len: int, fp32: bool, sm90: tuple, sm80: tuple
) -> None:
    """Hopper and later keep the tiles measured on an H200, as does the interpreter (None);
    sm_8x takes fewer keys per step where ptxas spills there (tools/kernel_report.py)."""
    assert tile_config(head_dim, group_pad, max_query_len, fp32) == sm90
    assert tile_config(head_dim, group_pad, max_query_len, fp32, SM90) == sm90
    assert tile_config(head_dim, group_pad, max_query_len, fp32, (10, 0)) == sm90
    assert tile_config(head_dim, group_pad, max_query_len, fp32, SM80) == sm80
    assert tile_config(head_dim, group_pad, max_query_len, fp32, (8, 6)) == sm80


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("case", "block_n"),
    [
        pytest.param(*p.values, block_n, id=p.id)
        for p, block_n in (
            (param("prefill-bf16", (70, 40), (9, 1), (33, 33), num_heads=8, dtype=torch.bfloat16), 32),
            (param("window-fp16", (40, 1), (45, 21), sliding_window=16, dtype=torch.float16, block_size=8), 32),
            (param("prefill-fp32", (40, 23), (17, 1), (5, 5), block_size=8), 16),
            (param("head256-fp32", (35, 6), (20, 1), num_heads=2, num_kv_heads=1, head_dim=256), 16),
            (
                param(
                    "split4-head256-fp32", (100, 1), (37, 1), num_heads=2, num_kv_heads=1, head_dim=256, num_splits=4
                ),
                16,
            ),
        )
    ],
)
def test_sm8x_tiles_match_reference(case: Case, block_n: int, device: str, monkeypatch) -> None:
    """The kernel with the tiles the wrapper picks on an A100, whatever runs it."""
    picked = []

    def sm80_tiles(*args):
        picked.append(tile_config(*args[:4], capability=SM80))
        return picked[-1]

    monkeypatch.setattr(pa, "tile_config", sm80_tiles)
    batch = make_batch(case, device)
    assert_matches_reference(run_attention(batch, expected_cache(batch, batch.kv_cache)), batch)
    assert [tiles[1] for tiles in picked] == [block_n]


def test_fp8_kv_cache_needs_sm89() -> None:
    with pytest.raises(
        ValueError,
        match=r"cache\.cache_dtype=fp8: .*compute capability 8\.9 or newer.*"
        r"\(this one is 8\.0\); use cache\.cache_dtype=auto",
    ):
        check_fp8_kv_capability(SM80)
    with pytest.raises(ValueError, match=r"cache\.cache_dtype=fp8_e4m3: .*this one is 8\.6"):
        check_fp8_kv_capability((8, 6), "fp8_e4m3")
    for capability in ((8, 9), SM90, (10, 0)):
        check_fp8_kv_capability(capability)


def _runner(kv_dtype: torch.dtype, device: str, backend: str = "triton") -> SimpleNamespace:
    """What ModelRunner's start-up check reads off a runner."""
    cache_dtype = "fp8" if kv_dtype == torch.float8_e4m3fn else "auto"
    cfg = SimpleNamespace(
        kv_cache_dtype=kv_dtype,
        cache=SimpleNamespace(cache_dtype=cache_dtype),
        attention=SimpleNamespace(backend={"_target_": backend}),
        load=SimpleNamespace(loader={"_target_": "loader"}),
    )
    return SimpleNamespace(cfg=cfg, device=torch.device(device), attn_backend=SimpleNamespace(name=backend))


@pytest.mark.parametrize(
    ("capability", "kv_dtype", "backend", "refused"),
    [
        (SM80, torch.float8_e4m3fn, "triton", True),
        ((8, 6), torch.float8_e4m3fn, "triton", True),
        ((8, 9), torch.float8_e4m3fn, "triton", False),
        (SM90, torch.float8_e4m3fn, "triton", False),
        (SM80, torch.bfloat16, "triton", False),
        (SM80, torch.float8_e4m3fn, "torch", False),  # the torch backend reads fp8 through torch casts
    ],
)
def test_model_runner_refuses_fp8_kv_where_the_kernels_do_not_compile(
    capability: tuple, kv_dtype: torch.dtype, backend: str, refused: bool, monkeypatch
) -> None:
    from minivllm.worker.model_runner import ModelRunner

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    runner = _runner(kv_dtype, "cuda:0", backend)
    if refused:
        with pytest.raises(ValueError, match=r"cache\.cache_dtype=fp8: .*8\.9 or newer"):
            ModelRunner._check_kv_cache_dtype(runner)
    else:
        ModelRunner._check_kv_cache_dtype(runner)


def test_fp8_kv_check_runs_before_the_weights_load_and_not_on_the_cpu(monkeypatch) -> None:
    from minivllm.worker import model_runner
    from minivllm.worker.model_runner import ModelRunner

    def instantiate_target(node):  # the backend first, then the loader: never reached on an A100
        assert node["_target_"] == "triton", "the loader was built before the KV-cache dtype was checked"
        return SimpleNamespace(name="triton")

    monkeypatch.setattr(model_runner, "instantiate_target", instantiate_target)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: SM80)
    runner = _runner(torch.float8_e4m3fn, "cuda:0")
    runner._check_kv_cache_dtype = lambda: ModelRunner._check_kv_cache_dtype(runner)
    with pytest.raises(ValueError, match=r"cache\.cache_dtype=fp8"):
        ModelRunner.load_model(runner)
    ModelRunner._check_kv_cache_dtype(_runner(torch.float8_e4m3fn, "cpu"))  # the interpreter / torch path


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "case",
    [
        param("mixed", (1000, 1), (2049, 1), (4096, 1), (1500, 700), (300, 300)),
        param("decode-split-by-default", (4000, 1), (3000, 1)),
    ],
)
def test_realistic_batch_on_gpu(case: Case) -> None:
    """Long contexts and large chunks: sizes the interpreter cannot afford."""
    case = dataclasses.replace(case, num_heads=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    batch = make_batch(case, "cuda")
    assert_matches_reference(run_attention(batch, expected_cache(batch, batch.kv_cache)), batch)


BAD_INPUTS = {  # name -> (function of a valid batch that breaks one thing, expected message)
    "seq_lens-int64": (lambda b: dict(seq_lens=b.meta.seq_lens.long()), "seq_lens must be int32"),
    "query_start_loc-len": (
        lambda b: dict(query_start_loc=b.meta.query_start_loc[:-1]),
        r"query_start_loc must be \(B \+ 1,\)",
    ),
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
    args = dict(
        query=batch.query,
        kv_cache=batch.kv_cache,
        query_start_loc=batch.meta.query_start_loc,
        seq_lens=batch.meta.seq_lens,
        block_tables=batch.meta.block_tables,
    )
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
