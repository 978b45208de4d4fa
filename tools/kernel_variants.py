"""Every launch of the package's Triton kernels, as its wrapper makes it for a benchmark
shape on a GPU of a given architecture, for ``tools/kernel_report.py`` (compiled and
checked without a GPU) and the kernel benchmarks' ``--tune`` mode (``tools/gemm_tune.py``).

A variant is one launch: the wrapper's own functions choose the tiles, warps and splits
(``tile_config`` with that compute capability, ``default_num_splits``, the GEMMs'
``heuristic_tiles``, ``launch_constexprs``, ...), and the arguments are stand-in tensors
of the right dtype and shape (``Tensor``), integers and floats of the benchmark's sizes.
Each builder mirrors its wrapper's launch.

The grouped (fused-MoE), int4 and fp8 GEMMs: for each benchmark shape, every config the
wrapper's heuristic picks at the benchmark's token counts, and every candidate the
benchmark's ``--tune`` mode times, so that a config the engine or the tuner can launch
is compiled (and checked for spills and shared memory) on each architecture. A config
is built once, at the first token count that picks it: the tiles, warps and stages are
what its resources depend on. The int4 GEMM is built on its contiguous-groups path for
every config and on its act-order path for the heuristic's picks; the split-K
reduction at the splits those configs use.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
NUM_SMS = 132  # H100 SXM: the split-KV choice is made for it
MODEL_YAML = ROOT / "conf" / "model" / "qwen3-0.6b.yaml"
INT4_GROUP = 128  # benchmarks/quant_gemm.py's group size


class Tensor:
    """A stand-in for a contiguous CUDA tensor at a launch: dtype, shape, strides and a
    16-byte-aligned address are all Triton's specialization looks at."""

    def __init__(self, dtype: torch.dtype, *shape: int) -> None:
        self.dtype, self.shape = dtype, shape
        self._strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))

    def stride(self, dim: int | None = None):
        return self._strides if dim is None else self._strides[dim]

    @staticmethod
    def data_ptr() -> int:
        return 0  # CUDA allocations are 256-byte aligned

    def __getitem__(self, index: tuple[slice, slice]) -> "Tensor":
        """``t[:, a:b]`` of a 2-D tensor: the same row stride, fewer columns."""
        rows, columns = index
        assert rows == slice(None) and len(self.shape) == 2, "only column slices of a matrix"
        view = Tensor(self.dtype, self.shape[0], len(range(*columns.indices(self.shape[1]))))
        view._strides = self._strides
        return view


@dataclass
class Variant:
    kernel: Any  # a triton JITFunction
    label: str
    args: dict[str, Any]  # every kernel argument by name, constexprs included
    options: dict[str, Any] = field(default_factory=dict)  # num_warps / num_stages if the wrapper passes them
    fp8_kv: bool = False  # part of a launch over an fp8 KV cache (refused at start-up below sm_89)
    capability_check: Callable[[tuple[int, int]], None] | None = None  # the wrapper's ValueError for a GPU

    @property
    def kernel_name(self) -> str:
        return self.kernel.fn.__name__


def model_shape() -> dict:
    import yaml

    hf = yaml.safe_load(MODEL_YAML.read_text())["hf_config"]
    return dict(
        hidden=hf["hidden_size"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        dtype=getattr(torch, hf["torch_dtype"]),
        rms_norm_eps=hf["rms_norm_eps"],
        max_position=hf["max_position_embeddings"],
        intermediate=hf["intermediate_size"],
    )


def capability(arch: int) -> tuple[int, int]:
    """80 -> (8, 0): the compute capability ``torch.cuda.get_device_capability`` gives on that GPU."""
    return divmod(arch, 10)


def benchmark_module(name: str):
    """The script ``benchmarks/<name>.py`` as a module (its SHAPES, TOKENS, TUNE_TOKENS, ...), loaded once."""
    import importlib.util

    module_name = f"_benchmark_{name}"  # benchmarks/ is no package: load the script by path
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, ROOT / "benchmarks" / f"{name}.py")
        sys.modules[module_name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[module_name]


# --------------------------------------------------------------------------------------------
# Attention, the layer ops, LoRA and the fp8 activation quantization.


def paged_attention_launches(
    label: str,
    *,
    arch: int,
    dtype: torch.dtype,
    num_reqs: int,
    query_len: int,
    context_len: int,
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    kv_dtype: torch.dtype | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    num_tokens: int | None = None,
    sinks: bool = False,
) -> list[Variant]:
    """``paged_attention`` on a CUDA device of compute capability ``arch`` (80: 8.0) with NUM_SMS
    multiprocessors: requests of at most ``query_len`` new tokens (all of them: ``num_tokens``
    None) at the end of ``context_len`` tokens; ``num_splits`` left to the wrapper."""
    from minivllm.attention.ops import paged_attention_kernels as kernels
    from minivllm.attention.ops.paged_attention_tiles import default_num_splits, tile_config

    num_tokens = num_reqs * query_len if num_tokens is None else num_tokens
    group = num_heads // num_kv_heads
    block_q, block_n, num_warps = tile_config(
        head_dim, triton.next_power_of_2(group), query_len, dtype == torch.float32, capability(arch)
    )
    num_q_tiles = triton.cdiv(query_len, block_q)
    num_splits = default_num_splits(NUM_SMS, num_reqs * num_q_tiles * num_kv_heads, query_len, context_len)
    split_len = triton.cdiv(triton.cdiv(context_len, num_splits), block_n) * block_n
    blocks_per_req = triton.cdiv(context_len, block_size)
    query, out = Tensor(dtype, num_tokens, num_heads, head_dim), Tensor(dtype, num_tokens, num_heads, head_dim)
    kv_cache = Tensor(kv_dtype or dtype, 2, num_reqs * blocks_per_req, block_size, num_kv_heads, head_dim)
    block_tables = Tensor(torch.int32, num_reqs, blocks_per_req)
    seq_lens, query_start_loc = Tensor(torch.int32, num_reqs), Tensor(torch.int32, num_reqs + 1)
    partials = [out] * 3
    if num_splits > 1:
        partials = [Tensor(torch.float32, num_splits, num_tokens, num_heads, *shape) for shape in ((head_dim,), (), ())]
    label = f"{label} bs{block_size} split{num_splits}"
    fp8_kv = kv_dtype == torch.float8_e4m3fn  # the whole launch: the engine refuses the cache, not one kernel
    attention = Variant(
        kernels._paged_attention_kernel,
        label,
        dict(
            out_ptr=out,
            part_acc_ptr=partials[0],
            part_max_ptr=partials[1],
            part_sum_ptr=partials[2],
            q_ptr=query,
            kv_ptr=kv_cache,
            block_tables_ptr=block_tables,
            seq_lens_ptr=seq_lens,
            query_start_loc_ptr=query_start_loc,
            sinks_ptr=Tensor(dtype, num_heads),  # the model's parameter
            scale=head_dim**-0.5,
            soft_cap=soft_cap or 0.0,
            window=sliding_window or 0,
            split_len=split_len,
            num_tokens=num_tokens,
            num_heads=num_heads,
            k_scale=1.0,
            v_scale=1.0,
            stride_qt=query.stride(0),
            stride_qh=query.stride(1),
            stride_ot=out.stride(0),
            stride_oh=out.stride(1),
            stride_kv=kv_cache.stride(0),
            stride_cb=kv_cache.stride(1),
            stride_cs=kv_cache.stride(2),
            stride_ch=kv_cache.stride(3),
            stride_bt=block_tables.stride(0),
            HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            BLOCK_SIZE=block_size,
            GROUP=group,
            GROUP_PAD=triton.next_power_of_2(group),
            BLOCK_Q=block_q,
            BLOCK_N=block_n,
            NUM_SPLITS=num_splits,
            USE_WINDOW=sliding_window is not None,
            USE_SOFT_CAP=soft_cap is not None,
            FP32_DOT=dtype == torch.float32,
            FP8_KV=fp8_kv,
            USE_SINKS=sinks,
        ),
        dict(num_warps=num_warps),
        fp8_kv=fp8_kv,
    )
    if num_splits == 1:
        return [attention]
    combine = Variant(
        kernels._combine_splits_kernel,
        label,
        dict(
            out_ptr=out,
            part_acc_ptr=partials[0],
            part_max_ptr=partials[1],
            part_sum_ptr=partials[2],
            query_start_loc_ptr=query_start_loc,
            sinks_ptr=Tensor(dtype, num_heads),  # the model's parameter
            num_reqs=num_reqs,
            num_tokens=num_tokens,
            num_heads=num_heads,
            stride_ot=out.stride(0),
            stride_oh=out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            NUM_SPLITS=num_splits,
            USE_SINKS=sinks,
        ),
        fp8_kv=fp8_kv,
    )
    return [attention, combine]


def write_kv_launch(
    label: str,
    *,
    dtype: torch.dtype,
    num_tokens: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_blocks: int,
    kv_dtype: torch.dtype | None = None,
) -> Variant:
    """``write_kv`` of the keys and values split off a fused qkv projection output."""
    from minivllm.attention.kv_quant import FP8_KV_DTYPE
    from minivllm.attention.ops import triton_kv_write as kvw

    qkv_heads = 3 * num_kv_heads  # a view of (T, H + 2 Hkv, D): strides of the fused output; H >= Hkv
    key = value = Tensor(dtype, num_tokens, qkv_heads, head_dim)
    kv_cache = Tensor(kv_dtype or dtype, 2, num_blocks, block_size, num_kv_heads, head_dim)
    fp8_kv = kv_cache.dtype == FP8_KV_DTYPE
    return Variant(
        kvw._write_kv_kernel,
        f"{label} bs{block_size}",
        dict(
            key_ptr=key,
            value_ptr=value,
            kv_ptr=kv_cache,
            slot_mapping_ptr=Tensor(torch.int64, num_tokens),
            k_scale=1.0,
            v_scale=1.0,
            stride_kt=key.stride(0),
            stride_kh=key.stride(1),
            stride_vt=value.stride(0),
            stride_vh=value.stride(1),
            stride_kv=kv_cache.stride(0),
            stride_cb=kv_cache.stride(1),
            stride_cs=kv_cache.stride(2),
            stride_ch=kv_cache.stride(3),
            **kvw.launch_constexprs(num_kv_heads, head_dim, block_size, fp8_kv, False),
        ),
        fp8_kv=fp8_kv,
    )


def mla_decode_variants() -> list[Variant]:
    """``mla_decode`` at DeepSeek V3's latent (kv_lora_rank 512 + rope 64): 128 heads (tp=1) and
    16 (tp=8), a bf16 and an fp8 latent cache, blocks of 16 tokens."""
    from minivllm.attention.kv_quant import FP8_KV_DTYPE
    from minivllm.attention.ops import triton_mla_decode as mla

    r, dr, block_size, num_blocks, batch = 512, 64, 16, 4096, 64
    out = []
    for heads in (128, 16):
        for kv_dtype in (torch.bfloat16, FP8_KV_DTYPE):
            q = Tensor(torch.bfloat16, batch, heads, r + dr)
            kv_cache = Tensor(kv_dtype, num_blocks, block_size, 1, r + dr)
            o = Tensor(torch.bfloat16, batch, heads, r)
            tables = Tensor(torch.int32, batch, 256)
            fp8 = kv_dtype == FP8_KV_DTYPE
            args = dict(
                q_ptr=q,
                kv_ptr=kv_cache,
                block_tables_ptr=tables,
                seq_lens_ptr=Tensor(torch.int32, batch),
                out_ptr=o,
                scale=0.1,
                k_scale=1.0,
                num_heads=heads,
                stride_qb=q.stride(0),
                stride_qh=q.stride(1),
                stride_ob=o.stride(0),
                stride_oh=o.stride(1),
                stride_bt=tables.stride(0),
                stride_kv_slot=kv_cache.stride(1),
                **mla.launch_constexprs(r, dr, heads, block_size, fp8, False),
            )
            label = f"mla decode H{heads} r{r}+{dr} {'fp8' if fp8 else 'bf16'} kv"
            out.append(Variant(mla._mla_decode_kernel, label, args, {"num_warps": mla.num_warps_for(r)}, fp8_kv=fp8))
    return out + [mla_latent_write_launch(kv_dtype) for kv_dtype in (torch.bfloat16, FP8_KV_DTYPE)]


def mla_prefill_variants() -> list[Variant]:
    """``mla_prefill`` at DeepSeek V3's (and V2's) head shape: nope 128 + rope 64, value 128, bf16;
    16 heads (tp=8) of a 2048-token chunk over 4096 keys: causal (the new tokens, alone or with the
    log-sum-exp when earlier context follows), and every key visible with the log-sum-exp (a piece of
    earlier context, merged after)."""
    from minivllm.attention.ops import triton_mla_prefill as mla

    heads, dn, dr, dv, tq, lk = 16, 128, 64, 128, 2048, 4096
    q_nope, q_pe = Tensor(torch.bfloat16, tq, heads, dn), Tensor(torch.bfloat16, tq, heads, dr)
    k_nope, k_pe, v = (
        Tensor(torch.bfloat16, lk, heads, dn),
        Tensor(torch.bfloat16, lk, dr),
        Tensor(torch.bfloat16, lk, heads, dv),
    )
    out, lse = Tensor(torch.bfloat16, tq, heads, dv), Tensor(torch.float32, tq, heads)
    options = {"num_warps": mla.NUM_WARPS, "num_stages": mla.NUM_STAGES}
    variants = []
    for causal, store_lse in ((True, False), (True, True), (False, True)):
        args = dict(
            q_nope_ptr=q_nope,
            q_pe_ptr=q_pe,
            k_nope_ptr=k_nope,
            k_pe_ptr=k_pe,
            v_ptr=v,
            out_ptr=out,
            lse_ptr=lse,
            cu_q_ptr=Tensor(torch.int32, 2),
            cu_k_ptr=Tensor(torch.int32, 2),
            scale=0.1,
            stride_qn_t=q_nope.stride(0),
            stride_qn_h=q_nope.stride(1),
            stride_qp_t=q_pe.stride(0),
            stride_qp_h=q_pe.stride(1),
            stride_kn_t=k_nope.stride(0),
            stride_kn_h=k_nope.stride(1),
            stride_kp_t=k_pe.stride(0),
            stride_v_t=v.stride(0),
            stride_v_h=v.stride(1),
            stride_o_t=out.stride(0),
            stride_o_h=out.stride(1),
            stride_lse_t=lse.stride(0),
            **mla.launch_constexprs(dn, dr, dv, False, causal=causal, store_lse=store_lse),
        )
        kind = ("causal" if causal else "context piece") + (" +lse" if store_lse else "")
        label = f"mla prefill H{heads} {dn}+{dr}/{dv} bf16 {tq}@{lk} {kind}"
        variants.append(Variant(mla._mla_prefill_kernel, label, args, options))
    return variants


def mla_latent_write_launch(kv_dtype: torch.dtype) -> Variant:
    """``triton_kv_write.write_latent``: 256 tokens' V3 latents (512 + 64) into a latent cache."""
    from minivllm.attention.kv_quant import FP8_KV_DTYPE
    from minivllm.attention.ops import triton_kv_write as kvw

    width, tokens = 512 + 64, 256
    latent = Tensor(torch.bfloat16, tokens, width)
    kv_cache = Tensor(kv_dtype, 4096, 16, 1, width)
    fp8 = kv_dtype == FP8_KV_DTYPE
    return Variant(
        kvw._write_kv_kernel,
        f"mla latent write {tokens} tokens r512+64 {'fp8' if fp8 else 'bf16'} kv",
        dict(
            key_ptr=latent,
            value_ptr=latent,
            kv_ptr=kv_cache,
            slot_mapping_ptr=Tensor(torch.int64, tokens),
            k_scale=1.0,
            v_scale=1.0,
            stride_kt=latent.stride(0),
            stride_kh=0,
            stride_vt=latent.stride(0),
            stride_vh=0,
            stride_kv=0,
            stride_cb=kv_cache.stride(0),
            stride_cs=kv_cache.stride(1),
            stride_ch=kv_cache.stride(2),
            **kvw.launch_constexprs(1, width, 16, fp8, False, key_only=True),
        ),
        fp8_kv=fp8,
    )


def gated_delta_net_variants() -> list[Variant]:
    """Qwen3-Next-80B's Gated DeltaNet layer (32 v-heads, Dk = Dv = 128, q/k expanded from 16
    k-heads; conv over 2 * 16 * 128 + 32 * 128 channels, kernel 4), bf16 activations: the conv
    (with and without a bias), the recurrent decode step at batch 256 and the two chunk kernels
    of a 4096-token prefill in 64-token chunks."""
    from minivllm.layers.ops import triton_gated_delta_net as gdn

    heads, dk, dv, channels, width, slots, dtype = 32, 128, 128, 8192, 4, 512, torch.bfloat16
    out = []
    per_seq = lambda n: dict(  # noqa: E731
        state_idx_ptr=Tensor(torch.int32, n), cu_ptr=Tensor(torch.int32, n + 1), has_init_ptr=Tensor(torch.bool, n)
    )
    for tokens, n, bias in ((256, 256, True), (4096, 1, False)):
        x, y = Tensor(dtype, tokens, channels), Tensor(dtype, tokens, channels)
        w, states = Tensor(dtype, channels, width), Tensor(dtype, slots, channels, width - 1)
        args = dict(
            x_ptr=x,
            w_ptr=w,
            b_ptr=Tensor(dtype, channels),
            y_ptr=y,
            state_ptr=states,
            **per_seq(n),
            channels=channels,
            stride_xt=x.stride(0),
            stride_yt=y.stride(0),
            stride_wc=w.stride(0),
            stride_ss=states.stride(0),
            stride_sc=states.stride(1),
            stride_sk=states.stride(2),
            **gdn.conv_launch_constexprs(width, bias, True),
        )
        label = f"conv1d {channels} channels, K={width}, {tokens} tokens / {n} seqs" + (" +bias" if bias else "")
        out.append(Variant(gdn._causal_conv1d_kernel, label, args, {"num_warps": gdn.CONV_NUM_WARPS}))
    states = Tensor(torch.float32, slots, heads, dk, dv)
    state_strides = dict(stride_ss=states.stride(0), stride_sh=states.stride(1), stride_sk=states.stride(2))
    batch = 256
    q, v, g = Tensor(dtype, batch, heads, dk), Tensor(dtype, batch, heads, dv), Tensor(torch.float32, batch, heads)
    rec = dict(
        q_ptr=q,
        k_ptr=q,
        v_ptr=v,
        g_ptr=g,
        beta_ptr=g,
        o_ptr=v,
        state_ptr=states,
        **per_seq(batch),
        scale=dk**-0.5,
        stride_qt=q.stride(0),
        stride_qh=q.stride(1),
        stride_kt=q.stride(0),
        stride_kh=q.stride(1),
        stride_vt=v.stride(0),
        stride_vh=v.stride(1),
        stride_gt=g.stride(0),
        stride_bt=g.stride(0),
        stride_ot=v.stride(0),
        stride_oh=v.stride(1),
        **state_strides,
        **gdn.recurrent_launch_constexprs(dk, dv),
    )
    out.append(Variant(gdn._recurrent_kernel, f"decode H{heads} Dk{dk} Dv{dv}, batch {batch}", rec))
    tokens, chunk = 4096, 64
    constexprs = gdn.chunk_launch_constexprs(dk, dv, chunk)
    q, v, g = Tensor(dtype, tokens, heads, dk), Tensor(dtype, tokens, heads, dv), Tensor(torch.float32, tokens, heads)
    w, u = Tensor(torch.float32, tokens, heads, dk), Tensor(torch.float32, tokens, heads, dv)
    num_chunks = tokens // chunk + 1
    chunk_states = Tensor(torch.float32, num_chunks, heads, dk, dv)
    table = dict(chunk_start_ptr=Tensor(torch.int32, num_chunks), chunk_end_ptr=Tensor(torch.int32, num_chunks))
    wy = dict(
        k_ptr=q,
        v_ptr=v,
        g_ptr=g,
        beta_ptr=g,
        w_ptr=w,
        u_ptr=u,
        **table,
        stride_kt=q.stride(0),
        stride_kh=q.stride(1),
        stride_vt=v.stride(0),
        stride_vh=v.stride(1),
        stride_gt=g.stride(0),
        stride_bt=g.stride(0),
        stride_wt=w.stride(0),
        stride_wh=w.stride(1),
        stride_ut=u.stride(0),
        stride_uh=u.stride(1),
        **constexprs["wy"],
    )
    options = {"num_warps": gdn.CHUNK_NUM_WARPS, "num_stages": 1}
    label = f"prefill H{heads} Dk{dk} Dv{dv}, {tokens} tokens, chunks of {chunk}"
    out.append(Variant(gdn._chunk_wy_kernel, label, wy, options))
    passing = dict(
        k_ptr=q,
        g_ptr=g,
        w_ptr=w,
        u_ptr=u,
        h_ptr=chunk_states,
        state_ptr=states,
        **per_seq(1),
        first_chunk_ptr=Tensor(torch.int32, 1),
        stride_kt=q.stride(0),
        stride_kh=q.stride(1),
        stride_gt=g.stride(0),
        stride_wt=w.stride(0),
        stride_wh=w.stride(1),
        stride_ut=u.stride(0),
        stride_uh=u.stride(1),
        stride_hc=chunk_states.stride(0),
        stride_hh=chunk_states.stride(1),
        **state_strides,
        **constexprs["state"],
    )
    out.append(Variant(gdn._chunk_state_kernel, label, passing, options))
    output = dict(
        q_ptr=q,
        k_ptr=q,
        g_ptr=g,
        u_ptr=u,
        h_ptr=chunk_states,
        o_ptr=v,
        **table,
        scale=dk**-0.5,
        stride_qt=q.stride(0),
        stride_qh=q.stride(1),
        stride_kt=q.stride(0),
        stride_kh=q.stride(1),
        stride_gt=g.stride(0),
        stride_ut=u.stride(0),
        stride_uh=u.stride(1),
        stride_hc=chunk_states.stride(0),
        stride_hh=chunk_states.stride(1),
        stride_ot=v.stride(0),
        stride_oh=v.stride(1),
        **constexprs["output"],
    )
    out.append(Variant(gdn._chunk_output_kernel, label, output, options))
    return out


def _shape(
    dtype: torch.dtype, num_reqs: int, query_len: int, context_len: int, block_size: int, *, heads, **extra
) -> dict:
    """``paged_attention_launches`` keywords of one shape; ``heads``: (num_heads, num_kv_heads, head_dim)."""
    num_heads, num_kv_heads, head_dim = heads
    return dict(
        dtype=dtype,
        num_reqs=num_reqs,
        query_len=query_len,
        context_len=context_len,
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        **extra,
    )


def attention_variants(arch: int) -> list[Variant]:
    """Qwen3-0.6B's attention on ``arch`` at the shapes of benchmarks/attention.py: decode at several
    batch sizes (and so several split counts), a prefill chunk, a mixed batch, 256-token
    KV blocks, an fp8 KV cache; and four other head shapes and dtypes (fp16, fp32 at head_dim
    128 and 256, a sliding window with a soft cap) for the wrapper's other tile choices."""
    m = model_shape()
    heads = dict(num_heads=m["num_heads"], num_kv_heads=m["num_kv_heads"], head_dim=m["head_dim"])
    context, (prefill_reqs, chunk, prefill_context) = 4096, (4, 512, 2048)  # benchmarks/attention.py defaults
    bf16 = dict(dtype=m["dtype"], **heads)
    fp8 = dict(bf16, kv_dtype=torch.float8_e4m3fn)
    decode = dict(query_len=1, context_len=context)
    prefill = dict(num_reqs=prefill_reqs, query_len=chunk, context_len=prefill_context)
    prefill_label = f"prefill {prefill_reqs}x{chunk}@{prefill_context}"
    shapes: list[tuple[str, dict]] = [
        *((f"decode {b}x{context}", dict(bf16, **decode, num_reqs=b, block_size=16)) for b in (1, 16, 64, 256)),
        (prefill_label, dict(bf16, **prefill, block_size=16)),
        # A mixed step: the tiles follow the longest query, so decode rows riding with a chunk
        # take the prefill tiles.
        (
            f"mixed 63 decode + 1 chunk of {chunk}",
            dict(bf16, num_reqs=64, query_len=chunk, num_tokens=63 + chunk, context_len=context, block_size=16),
        ),
        (f"decode 1x{context}", dict(bf16, **decode, num_reqs=1, block_size=256)),
        (prefill_label, dict(bf16, **prefill, block_size=256)),
        (f"fp8-kv decode 64x{context}", dict(fp8, **decode, num_reqs=64, block_size=16)),
        (f"fp8-kv decode 1x{context}", dict(fp8, **decode, num_reqs=1, block_size=16)),
        (f"fp8-kv prefill {prefill_reqs}x{chunk}", dict(fp8, **prefill, block_size=16)),
        ("fp16 h24/8 d80 prefill 2x64@300", _shape(torch.float16, 2, 64, 300, 8, heads=(24, 8, 80))),
        (
            "fp32 h4/4 d256 window prefill 2x64@512",
            _shape(torch.float32, 2, 64, 512, 64, heads=(4, 4, 256), sliding_window=128),
        ),
        ("fp32 h16/16 d128 prefill 2x64@512", _shape(torch.float32, 2, 64, 512, 16, heads=(16, 16, 128))),
        (
            "bf16 h32/8 window+softcap decode 2x1024",
            _shape(torch.bfloat16, 2, 1, 1024, 16, heads=(32, 8, 128), sliding_window=512, soft_cap=50.0),
        ),
        # gpt-oss-20b's heads (64 over 8, head_dim 64) with sinks: split decode, a windowed prefill chunk.
        ("gpt-oss sinks decode 4x4096", _shape(torch.bfloat16, 4, 1, 4096, 16, heads=(64, 8, 64), sinks=True)),
        (
            "gpt-oss sinks window128 prefill 4x512@2048",
            _shape(torch.bfloat16, 4, 512, 2048, 16, heads=(64, 8, 64), sliding_window=128, sinks=True),
        ),
    ]
    out = [v for label, shape in shapes for v in paged_attention_launches(label, arch=arch, **shape)]
    kv = dict(dtype=m["dtype"], num_kv_heads=m["num_kv_heads"], head_dim=m["head_dim"])
    out.append(write_kv_launch("qwen3-0.6b 256 tokens", num_tokens=256, block_size=16, num_blocks=4096, **kv))
    out.append(write_kv_launch("qwen3-0.6b 256 tokens", num_tokens=256, block_size=256, num_blocks=256, **kv))
    out.append(
        write_kv_launch(
            "qwen3-0.6b 256 tokens fp8-kv",
            num_tokens=256,
            block_size=16,
            num_blocks=4096,
            kv_dtype=torch.float8_e4m3fn,
            **kv,
        )
    )
    return out


def layer_op_variants() -> list[Variant]:
    """RMSNorm (with and without the residual add; Gemma's too), rotary and SiLU-and-mul over Qwen3-0.6B's
    hidden size, heads and intermediate size."""
    from minivllm.layers.ops import fused_rms_norm, rotary_inplace, silu_and_mul

    m = model_shape()
    tokens, out = 256, []
    for residual, gemma in ((False, False), (True, False), (True, True)):
        x = Tensor(m["dtype"], tokens, m["hidden"])
        label = f"hidden {m['hidden']}" + (" +residual" if residual else "") + (" gemma" if gemma else "")
        out.append(
            Variant(
                fused_rms_norm._rms_norm_kernel,
                label,
                dict(
                    x_ptr=x,
                    residual_ptr=x,
                    weight_ptr=Tensor(m["dtype"], m["hidden"]),
                    stride_x=x.stride(0),
                    stride_r=x.stride(0) if residual else 0,
                    eps=m["rms_norm_eps"],
                    **fused_rms_norm.launch_constexprs(m["hidden"], residual, gemma),
                ),
            )
        )
    qkv = Tensor(m["dtype"], tokens, m["num_heads"] + 2 * m["num_kv_heads"], m["head_dim"])  # q and k: views of it
    cos_sin = Tensor(torch.float32, m["max_position"], m["head_dim"])  # rotary over the whole head
    out.append(
        Variant(
            rotary_inplace._rotary_kernel,
            f"neox head_dim {m['head_dim']} (q and k)",
            dict(
                x_ptr=qkv,
                positions_ptr=Tensor(torch.int64, tokens),
                cache_ptr=cos_sin,
                stride_xt=qkv.stride(0),
                stride_xh=qkv.stride(1),
                **rotary_inplace.launch_constexprs(m["head_dim"], True),
            ),
        )
    )
    out += qkv_prep_variants(m, tokens)
    gate_up, act = Tensor(m["dtype"], tokens, 2 * m["intermediate"]), Tensor(m["dtype"], tokens, m["intermediate"])
    out.append(
        Variant(
            silu_and_mul._silu_and_mul_kernel,
            f"intermediate {m['intermediate']}",
            dict(
                x_ptr=gate_up,
                out_ptr=act,
                stride_x=gate_up.stride(0),
                stride_out=act.stride(0),
                **silu_and_mul.launch_constexprs(m["intermediate"]),
            ),
        )
    )
    return out


def lora_variants(rank: int = 16, slots: int = 8, tokens: int = 256) -> list[Variant]:
    """``lora_shrink_expand`` on Qwen3-0.6B's q_proj (benchmarks/lora.py's rank 16): shrink
    bf16 x into the fp32 buffer, expand the buffer into a column slice of the bf16 qkv output."""
    from minivllm.lora import triton_ops

    m = model_shape()
    hidden, q_size = m["hidden"], m["num_heads"] * m["head_dim"]
    qkv_out = Tensor(m["dtype"], tokens, q_size + 2 * m["num_kv_heads"] * m["head_dim"])
    x, buffer = Tensor(m["dtype"], tokens, hidden), Tensor(torch.float32, tokens, rank)
    a, b = Tensor(m["dtype"], slots, hidden, rank), Tensor(m["dtype"], slots, rank, q_size)
    segments = dict(
        idx_ptr=Tensor(torch.int64, tokens),
        seg_slot_ptr=Tensor(torch.int32, slots),
        seg_start_ptr=Tensor(torch.int32, slots),
        seg_len_ptr=Tensor(torch.int32, slots),
    )
    out = []
    for name, src, w, dst, add in (("shrink", x, a, buffer, False), ("expand", buffer, b, qkv_out[:, :q_size], True)):
        n, k = w.shape[2], w.shape[1]
        block_m, block_n, block_k = triton_ops.block_config(n, k)
        out.append(
            Variant(
                triton_ops._segmented_matmul_kernel,
                f"{name} q_proj rank {rank}",
                dict(
                    x_ptr=src,
                    w_ptr=w,
                    out_ptr=dst,
                    **segments,
                    N=n,
                    K=k,
                    stride_xm=src.stride(0),
                    stride_ws=w.stride(0),
                    stride_wk=w.stride(1),
                    stride_om=dst.stride(0),
                    ADD=add,
                    BLOCK_M=block_m,
                    BLOCK_N=block_n,
                    BLOCK_K=block_k,
                    FP32_DOT=src.dtype == torch.float32,
                ),
            )
        )
    return out


def mxfp4_dequant_variants() -> list[Variant]:
    """The MXFP4 expert dequantization of gpt-oss-20b's gate_up (32 experts x 5760 x 2880 / 32 groups), to bf16."""
    from minivllm.quantization import mxfp4

    groups = 32 * 5760 * 2880 // 32
    return [
        Variant(
            mxfp4._dequant_mxfp4_kernel,
            "gpt-oss-20b gate_up to bf16",
            dict(
                blocks_ptr=Tensor(torch.uint8, groups, 16),
                scales_ptr=Tensor(torch.uint8, groups),
                out_ptr=Tensor(torch.bfloat16, groups, 32),
                num_groups=groups,
                ROWS=64,
            ),
        )
    ]


def fp8_quant_variants() -> list[Variant]:
    """``quantize_fp8_rows`` of bf16 activations, dynamic and static, over the input sizes of
    benchmarks/quant_gemm.py's shapes (any M: the grid is one program per row) and a row
    too long for one tile (Llama-3-70B's down_proj). Refused below sm_89, as its wrapper does."""
    from minivllm.quantization import triton_fp8_quant as fq

    hiddens = sorted({shape.k for shape in benchmark_module("quant_gemm").SHAPES}) + [28672]
    out = []
    for hidden in hiddens:
        for static in (False, True):
            x, values = Tensor(torch.bfloat16, 1024, hidden), Tensor(torch.float8_e4m3fn, 1024, hidden)
            constexprs, num_warps = fq.launch_config(hidden, static, False)
            out.append(
                Variant(
                    fq._fp8_quant_kernel,
                    f"hidden {hidden} M=1..1024 {'static' if static else 'dynamic'}",
                    dict(
                        x_ptr=x,
                        out_ptr=values,
                        scale_ptr=Tensor(torch.float32, 1024, 1),
                        static_scale_ptr=Tensor(torch.float32, 1),
                        stride_x=x.stride(0),
                        **constexprs,
                    ),
                    dict(num_warps=num_warps),
                    capability_check=fq.check_fp8_quant_capability,
                )
            )
    return out


# --------------------------------------------------------------------------------------------
# The grouped (fused-MoE) and int4 GEMMs, at the heuristic's and the tuner's configs.


def moe_launch_variants(
    shape, tokens: int, tiles, dtype: torch.dtype = torch.bfloat16, biased: bool = False
) -> list[Variant]:
    """Both grouped GEMMs of ``triton_fused_experts`` for ``tokens`` on a benchmarks/moe.py shape
    (``biased``: with per-expert biases, as gpt-oss's experts)."""
    from minivllm.layers.fused_moe import triton_experts as te

    E, k, H, I = shape.experts, shape.top_k, shape.hidden, shape.intermediate
    t, bm = tokens, tiles.block_m
    max_padded = triton.cdiv(t * k + E * (bm - 1), bm) * bm
    routing = dict(
        weights_ptr=Tensor(torch.float32, t * k),
        sorted_ids_ptr=Tensor(torch.int32, max_padded),
        block_experts_ptr=Tensor(torch.int32, max_padded // bm),
        num_padded_ptr=Tensor(torch.int32, 1),
    )
    hidden, act = Tensor(dtype, t, H), Tensor(dtype, t * k, I)
    w13, w2 = Tensor(dtype, E, 2 * I, H), Tensor(dtype, E, H, I)
    splits = tiles.splits(I)
    down = Tensor(dtype, t * k, H) if splits == 1 else Tensor(torch.float32, splits, t * k, H)
    gemms = (
        ("gate_up", hidden, w13, Tensor(dtype, t * k, 2 * I), k, False, 1),
        ("down", act, w2, down, 1, True, splits),
    )
    out = []
    for name, a, w, c, a_rows_per_row, mul_weight, split in gemms:
        bias = Tensor(dtype, E, w.shape[1]) if biased else w
        args = dict(
            a_ptr=a,
            w_ptr=w,
            c_ptr=c,
            bias_ptr=bias,
            **routing,
            N=w.shape[1],
            K=w.shape[2],
            num_valid=c.shape[-2],
            stride_am=a.stride(0),
            stride_ak=a.stride(1),
            stride_we=w.stride(0),
            stride_wn=w.stride(1),
            stride_wk=w.stride(2),
            stride_cm=c.stride(-2),
            stride_cn=c.stride(-1),
            stride_cs=c.stride(0) if split > 1 else 0,
            k_per_split=tiles.k_per_split(w.shape[2]),
            stride_be=bias.stride(0) if biased else 0,
            A_ROWS_PER_ROW=a_rows_per_row,
            MUL_WEIGHT=mul_weight,
            HAS_BIAS=biased,
            FP32_DOT=dtype == torch.float32,
            BLOCK_M=tiles.block_m,
            BLOCK_N=tiles.block_n,
            BLOCK_K=tiles.block_k,
            GROUP_M=tiles.group_m,
            SPLIT_K=split,
        )
        options = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
        label = f"{shape.name} {name} T={t} {tiles.name}" + (" +bias" if biased else "")
        out.append(Variant(te._grouped_gemm_kernel, label, args, options))
    return out


def gpt_oss_moe_variants(arch: int) -> list[Variant]:
    """gpt-oss-20b's experts (32 of 2880 -> 2880, top-4; biases in both GEMMs) at the heuristic's
    tiles for a decode step and a prefill chunk."""
    from minivllm.layers.fused_moe import tiles as moe_tiles

    shape = benchmark_module("moe").Shape("gpt-oss-20b", 32, 4, 2880, 2880)
    out = []
    for tokens in (1, 1024):
        tiles = moe_tiles.heuristic_tiles(
            tokens, shape.experts, shape.top_k, arch, shape.hidden, shape.intermediate, NUM_SMS
        )
        out += moe_launch_variants(shape, tokens, tiles, biased=True)
    return out


def int4_launch_variant(shape, m: int, tiles, dtype: torch.dtype = torch.bfloat16, act_order: bool = False) -> Variant:
    """``int4_matmul`` of (m, K) activations on a benchmarks/quant_gemm.py weight shape: the
    contiguous-groups path (group INT4_GROUP, BLOCK_K cut to it as the wrapper does), or the
    act-order path through ``g_idx``."""
    from minivllm.quantization import triton_int4

    n, k = shape.n, shape.k
    group = 0 if act_order else INT4_GROUP
    tiles = tiles if act_order else triton_int4.fast_path_tiles(tiles, group)
    splits = tiles.splits(k)
    x = Tensor(dtype, m, k)
    out = Tensor(dtype, m, n) if splits == 1 else Tensor(torch.float32, splits, m, n)
    qweight, groups = Tensor(torch.int32, k // 8, n), k // INT4_GROUP
    scales, zeros = Tensor(dtype, groups, n), Tensor(torch.uint8, groups, n)
    args = dict(
        x_ptr=x,
        qw_ptr=qweight,
        scales_ptr=scales,
        zeros_ptr=zeros,
        gidx_ptr=Tensor(torch.int32, k),
        out_ptr=out,
        M=m,
        N=n,
        K=k,
        stride_xm=x.stride(0),
        stride_qk=qweight.stride(0),
        stride_sg=scales.stride(0),
        stride_zg=zeros.stride(0),
        stride_om=n,
        stride_os=m * n,
        k_per_split=tiles.k_per_split(k),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        SPLIT_K=splits,
        GROUP_SIZE=group,
        FP32_DOT=dtype == torch.float32,
    )
    options = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    path = "act-order" if act_order else "contiguous"
    return Variant(triton_int4._int4_matmul_kernel, f"{shape.name} M={m} {tiles.name} {path}", args, options)


def fp8_gemm_launch_variant(shape, m: int, tiles, dtype: torch.dtype = torch.float16) -> Variant:
    """``fp8_gemm`` of (m, K) fp8 activations on a benchmarks/quant_gemm.py weight shape with
    ``dtype`` output. Refused below sm_89, as its wrapper does."""
    from minivllm.quantization import triton_fp8_gemm as fg

    splits = tiles.splits(shape.k)
    x, w = Tensor(torch.float8_e4m3fn, m, shape.k), Tensor(torch.float8_e4m3fn, shape.n, shape.k)
    c = Tensor(dtype, m, shape.n) if splits == 1 else Tensor(torch.float32, splits, m, shape.n)
    args = dict(
        x_ptr=x,
        w_ptr=w,
        x_scale_ptr=Tensor(torch.float32, m),
        w_scale_ptr=Tensor(torch.float32, shape.n),
        bias_ptr=Tensor(torch.float32, shape.n),
        out_ptr=c,
        M=m,
        N=shape.n,
        K=shape.k,
        stride_xm=x.stride(0),
        stride_wn=w.stride(0),
        stride_om=shape.n,
        stride_os=m * shape.n,
        k_per_split=tiles.k_per_split(shape.k),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        SPLIT_K=splits,
        HAS_BIAS=False,
        FP32_DOT=False,
    )
    label = f"{shape.name} M={m} {tiles.name} {str(dtype).removeprefix('torch.')}"
    options = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return Variant(fg._fp8_gemm_kernel, label, args, options, capability_check=fg.check_fp8_gemm_capability)


def fp8_gemm_variants(arch: int) -> list[Variant]:
    """``fp8_gemm`` at benchmarks/quant_gemm.py's shapes and token counts: ``fp8_tiles``' picks
    with fp16 output (where fp8 linears use it), and the tuner's candidates with bf16 output."""
    from minivllm.quantization import triton_fp8_gemm as fg

    bench, out, seen = benchmark_module("quant_gemm"), [], set()
    for shape in bench.SHAPES:
        picks = [(m, fg.fp8_tiles(m, shape.n, shape.k, arch, NUM_SMS), torch.float16) for m in bench.TOKENS]
        picks += [
            (m, c, torch.bfloat16)
            for m in bench.TUNE_TOKENS
            for c in fg.tune_candidates(m, shape.n, shape.k, arch, NUM_SMS)
        ]
        for m, tiles, dtype in picks:
            key = (shape.name, tiles, m == 1, dtype)
            if key not in seen:
                seen.add(key)
                out.append(fp8_gemm_launch_variant(shape, m, tiles, dtype))
    return out


def int4_sum_variants() -> list[Variant]:
    """The split-K reduction of ``int4_matmul`` at the splits the int4 configs use."""
    from minivllm.quantization import triton_int4

    out, seen = [], set()
    for arch in (80, 90):
        for shape, m, tiles in int4_configs(arch):
            splits = tiles.splits(shape.k)
            if splits > 1 and (splits, m == 1) not in seen:
                seen.add((splits, m == 1))
                args = dict(
                    partials_ptr=Tensor(torch.float32, splits, m, shape.n),
                    out_ptr=Tensor(torch.bfloat16, m, shape.n),
                    numel=m * shape.n,
                    SPLITS=splits,
                    BLOCK=triton_int4.SUM_BLOCK,
                )
                out.append(Variant(triton_int4._sum_splits_kernel, f"{splits} splits M={m}", args, {}))
    return out


def moe_configs(arch: int) -> list[tuple[object, int, object]]:
    """(shape, tokens, tiles) of every config the heuristic or the tuner uses at the
    benchmark's shapes, each config once per shape."""
    from minivllm.layers.fused_moe import tiles as moe_tiles

    bench = benchmark_module("moe")
    seen, out = set(), []
    for shape in bench.SHAPES:
        picks = [
            (t, moe_tiles.heuristic_tiles(t, shape.experts, shape.top_k, arch, shape.hidden)) for t in bench.TOKENS
        ]
        picks += [
            (t, c)
            for t in bench.TUNE_TOKENS
            for c in moe_tiles.tune_candidates(
                t, shape.experts, shape.top_k, arch, shape.hidden, shape.intermediate, NUM_SMS
            )
        ]
        for t, tiles in picks:
            if (shape.name, tiles) not in seen:
                seen.add((shape.name, tiles))
                out.append((shape, t, tiles))
    return out


def int4_configs(arch: int) -> list[tuple[object, int, object]]:
    """(shape, M, tiles) of every config the heuristic or the tuner uses at the benchmark's
    shapes; M=1 is kept apart (Triton compiles a kernel for an argument equal to 1)."""
    from minivllm.quantization import int4_tiles

    bench = benchmark_module("quant_gemm")
    seen, out = set(), []
    for shape in bench.SHAPES:
        picks = [(m, int4_tiles.heuristic_tiles(m, shape.n, shape.k, arch, NUM_SMS)) for m in bench.TOKENS]
        picks += [
            (m, c) for m in bench.TUNE_TOKENS for c in int4_tiles.tune_candidates(m, shape.n, shape.k, arch, NUM_SMS)
        ]
        for m, tiles in picks:
            key = (shape.name, m == 1, tiles)
            if key not in seen:
                seen.add(key)
                out.append((shape, m, tiles))
    return out


def fused_moe_variants(arch: int) -> list[Variant]:
    return [v for shape, t, tiles in moe_configs(arch) for v in moe_launch_variants(shape, t, tiles)]


def int4_variants(arch: int) -> list[Variant]:
    """Every config on the contiguous-groups path; the heuristic's picks on the act-order path too."""
    from minivllm.quantization import int4_tiles

    bench = benchmark_module("quant_gemm")
    general = [
        int4_launch_variant(
            shape, m, int4_tiles.heuristic_tiles(m, shape.n, shape.k, arch, NUM_SMS, act_order=True), act_order=True
        )
        for shape in bench.SHAPES
        for m in bench.TOKENS
    ]
    fast = [int4_launch_variant(shape, m, tiles) for shape, m, tiles in int4_configs(arch)]
    return fast + general + int4_sum_variants()


def qkv_prep_variants(m: dict, tokens: int) -> list[Variant]:
    """The fused q/k-norm + rotary + KV write over Qwen3-0.6B's heads (with the norms, as Qwen3; without,
    as Llama), 16-token KV blocks."""
    from minivllm.layers.ops import qk_norm_rope_kv

    heads, kv_heads, head_dim = m["num_heads"], m["num_kv_heads"], m["head_dim"]
    qkv = Tensor(m["dtype"], tokens, heads + 2 * kv_heads, head_dim)  # q, k and v: views of it
    cache = Tensor(m["dtype"], 2, 4096, 16, kv_heads, head_dim)
    out = []
    for norm in (True, False):
        args = dict(
            q_ptr=qkv,
            k_ptr=qkv,
            v_ptr=qkv,
            positions_ptr=Tensor(torch.int64, tokens),
            cache_ptr=Tensor(torch.float32, m["max_position"], head_dim),
            q_weight_ptr=Tensor(m["dtype"], head_dim),
            k_weight_ptr=Tensor(m["dtype"], head_dim),
            kv_ptr=cache,
            slot_mapping_ptr=Tensor(torch.int64, tokens),
            eps=m["rms_norm_eps"],
            stride_qt=qkv.stride(0),
            stride_qh=qkv.stride(1),
            stride_kt=qkv.stride(0),
            stride_kh=qkv.stride(1),
            stride_vt=qkv.stride(0),
            stride_vh=qkv.stride(1),
            stride_kv=cache.stride(0),
            stride_cb=cache.stride(1),
            stride_cs=cache.stride(2),
            stride_ch=cache.stride(3),
            **qk_norm_rope_kv.launch_constexprs(heads, head_dim, head_dim, 16, True, norm),
        )
        label = f"head_dim {head_dim}, {heads}/{kv_heads} heads" + (" +qk-norm" if norm else "")
        out.append(Variant(qk_norm_rope_kv._qk_norm_rope_kv_kernel, label, args))
    return out


def graph_staging_variants() -> list[Variant]:
    """The CUDA-graph input staging of a 256-request decode step into graphs captured up to 256 rows,
    block tables as wide as the default ``compilation.max_seq_len_to_capture`` (8192) in 16-token blocks."""
    from minivllm.config.device import CompilationConfig
    from minivllm.worker import cuda_graphs

    reqs, dst_width = 256, CompilationConfig().max_seq_len_to_capture // 16
    wide, narrow = (Tensor(torch.int64, reqs), Tensor(torch.int32, reqs))
    src_tables, dst_tables = Tensor(torch.int32, reqs, 64), Tensor(torch.int32, reqs, dst_width)
    flags = Tensor(torch.bool, reqs)
    variants = []
    for states in (False, True):  # hybrid models also stage their state slots and continuation flags
        args = dict(
            src_ids_ptr=wide,
            src_pos_ptr=wide,
            src_slots_ptr=wide,
            src_lens_ptr=narrow,
            src_tables_ptr=src_tables,
            src_state_idx_ptr=narrow,
            src_has_init_ptr=flags if states else narrow,
            dst_ids_ptr=wide,
            dst_pos_ptr=wide,
            dst_slots_ptr=wide,
            dst_lens_ptr=narrow,
            dst_tables_ptr=dst_tables,
            dst_state_idx_ptr=narrow,
            dst_has_init_ptr=flags if states else narrow,
            num_reqs=reqs - 3,
            src_width=64,
            stride_src_table=src_tables.stride(0),
            stride_dst_table=dst_tables.stride(0),
            **cuda_graphs.stage_launch_constexprs(dst_width, states),
        )
        label = f"{reqs} rows, tables {dst_width} wide" + (", state slots" if states else "")
        variants.append(Variant(cuda_graphs._stage_inputs_kernel, label, args))
    return variants


def sampler_variants(rows: int = 256) -> list[Variant]:
    """The fused sampler over Qwen3's 151,936-token vocabulary (fp32 logits, as ``compute_logits``
    gives them, and bf16), with and without rows truncated by top-k / top-p / min-p; and a small
    vocabulary, where a program takes several rows."""
    from minivllm.sample import triton_sampler

    out = []
    for vocab, dtype, masked in (
        (151_936, torch.float32, False),
        (151_936, torch.float32, True),
        (151_936, torch.bfloat16, False),
        (1_000, torch.float32, True),
    ):
        logits, processed = Tensor(dtype, rows, vocab), Tensor(torch.float32, rows, vocab)
        per_row = dict(
            masked_rows_ptr=Tensor(torch.int32, rows),
            temperature_ptr=Tensor(torch.float32, rows),
            seed_ptr=Tensor(torch.int64, rows),
            offset_ptr=Tensor(torch.int64, rows),
            out_ptr=Tensor(torch.int64, rows),
        )
        out.append(
            Variant(
                triton_sampler._fused_sample_kernel,
                f"{rows}x{vocab} {str(dtype).removeprefix('torch.')}" + (" +truncated rows" if masked else ""),
                dict(
                    logits_ptr=logits,
                    masked_ptr=processed,
                    **per_row,
                    num_rows=rows,
                    vocab_size=vocab,
                    stride_l=logits.stride(0),
                    stride_m=processed.stride(0),
                    **triton_sampler.launch_constexprs(vocab, masked),
                ),
                dict(num_warps=triton_sampler.NUM_WARPS),
            )
        )
    return out


def all_variants(arch: int) -> list[Variant]:
    """Every kernel's launches on a GPU of ``arch`` (the wrappers' choices may depend on it)."""
    gemms = fused_moe_variants(arch) + gpt_oss_moe_variants(arch) + int4_variants(arch) + fp8_gemm_variants(arch)
    small = layer_op_variants() + graph_staging_variants() + lora_variants() + fp8_quant_variants()
    attention = attention_variants(arch) + mla_decode_variants() + mla_prefill_variants()
    small += gated_delta_net_variants()
    return attention + small + sampler_variants() + gemms + mxfp4_dequant_variants()
