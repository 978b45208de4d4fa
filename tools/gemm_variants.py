"""Launches of the grouped (fused-MoE) and int4 GEMM kernels for ``tools/kernel_report.py``.

For each benchmark shape: every config the wrapper's heuristic picks at the benchmark's
token counts, and every candidate the benchmark's ``--tune`` mode times, so that a
config the engine or the tuner can launch is compiled (and checked for spills and
shared memory) on each architecture. A config is built once, at the first token count
that picks it: the tiles, warps and stages are what its resources depend on.
"""

from __future__ import annotations

import torch
import triton

from tools.kernel_report import NUM_SMS, Tensor, Variant, _benchmark_module

INT4_GROUP = 128  # benchmarks/quant_gemm.py's group size


def moe_launch_variants(shape, tokens: int, tiles, dtype: torch.dtype = torch.bfloat16) -> list[Variant]:
    """Both grouped GEMMs of ``triton_fused_experts`` for ``tokens`` on a benchmarks/moe.py shape."""
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
    gemms = (
        ("gate_up", hidden, w13, Tensor(dtype, t * k, 2 * I), k, False),
        ("down", act, w2, Tensor(dtype, t * k, H), 1, True),
    )
    out = []
    for name, a, w, c, a_rows_per_row, mul_weight in gemms:
        args = dict(
            a_ptr=a,
            w_ptr=w,
            c_ptr=c,
            **routing,
            N=w.shape[1],
            K=w.shape[2],
            num_valid=c.shape[0],
            stride_am=a.stride(0),
            stride_ak=a.stride(1),
            stride_we=w.stride(0),
            stride_wn=w.stride(1),
            stride_wk=w.stride(2),
            stride_cm=c.stride(0),
            stride_cn=c.stride(1),
            A_ROWS_PER_ROW=a_rows_per_row,
            MUL_WEIGHT=mul_weight,
            FP32_DOT=dtype == torch.float32,
            BLOCK_M=tiles.block_m,
            BLOCK_N=tiles.block_n,
            BLOCK_K=tiles.block_k,
            GROUP_M=tiles.group_m,
        )
        options = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
        label = f"{shape.name} {name} T={t} {tiles.name}"
        out.append(Variant(te._grouped_gemm_kernel, label, args, options))
    return out


def int4_launch_variant(shape, m: int, tiles, dtype: torch.dtype = torch.bfloat16) -> Variant:
    """``int4_matmul`` of (m, K) activations on a benchmarks/quant_gemm.py weight shape."""
    from minivllm.quantization import triton_int4

    n, k = shape.n, shape.k
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
        FP32_DOT=dtype == torch.float32,
    )
    options = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return Variant(triton_int4._int4_matmul_kernel, f"{shape.name} M={m} {tiles.name}", args, options)


def moe_configs(arch: int) -> list[tuple[object, int, object]]:
    """(shape, tokens, tiles) of every config the heuristic or the tuner uses at the
    benchmark's shapes, each config once per shape."""
    from minivllm.layers.fused_moe import tiles as moe_tiles

    bench = _benchmark_module("moe")
    seen, out = set(), []
    for shape in bench.SHAPES:
        picks = [(t, moe_tiles.heuristic_tiles(t, shape.experts, shape.top_k, arch)) for t in bench.TOKENS]
        picks += [
            (t, c) for t in bench.TUNE_TOKENS for c in moe_tiles.tune_candidates(t, shape.experts, shape.top_k, arch)
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

    bench = _benchmark_module("quant_gemm")
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
    return [int4_launch_variant(shape, m, tiles) for shape, m, tiles in int4_configs(arch)]
