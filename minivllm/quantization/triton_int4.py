"""Triton int4 dequantize-GEMM: ``y = x @ W`` with W unpacked tile by tile in registers.

Reads the common int4 layout of ``minivllm/quantization/int4.py``: for a tile of
BLOCK_K input rows and BLOCK_N output columns it loads the packed int32 words
(eight rows per word), shifts out each row's nibble, looks up the row's group
(``g_idx``) for its scale and zero, and multiplies the dequantized tile with the
matching tile of ``x``. The full-precision weight never exists in memory.

With ``SPLIT_K`` > 1 a third grid axis splits K: program (m, n, s) sums the K steps
of split s into its own fp32 partial ``out[s]`` (SPLIT_K, M, N), and the wrapper adds
the partials in fp32 before the one rounding to x's dtype (``split_k_range``,
``store_split_tile``, ``split_k_output`` and ``add_splits``, which the fp8 GEMM shares). The tiles come from
``int4_tiles.py`` (a heuristic by shape, or the tuned table for the device); the
partials are added by ``_sum_splits_kernel`` (one launch: fp32 sum, one rounding).

Two paths, picked by ``GROUP_SIZE`` (a constexpr):

- contiguous groups (``GROUP_SIZE`` > 0: AWQ, GPTQ without act-order): a K tile lies
  inside one group (``GROUP_SIZE % BLOCK_K == 0``), so the program loads one scale and
  one zero row (BLOCK_N,) per K step, loads each packed word once (BLOCK_K / 8 rows of
  words) and unpacks it in registers, feeds ``q - zero`` (exact in fp16/bf16: -16..15)
  to the tensor cores, and scales the (BLOCK_M, BLOCK_N) partial product in fp32: the
  per-element work is a shift, a mask and a subtraction.
- act-order (``GROUP_SIZE`` 0): each row's group through ``g_idx``, scale and zero
  gathered per element, the tile dequantized in fp32 before the dot.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from minivllm.attention.ops.checks import SUPPORTED_DTYPES, check_launchable, check_tensor, require
from minivllm.quantization.int4_tiles import Int4Tiles, choose_tiles
from minivllm.tuned_tiles import device_facts


@triton.jit
def split_k_range(K, k_per_split, SPLIT_K: tl.constexpr):
    """The [k_start, k_end) of K that this program sums: all of K without a split, else
    split ``program_id(2)``'s ``k_per_split`` rows (the last split may be shorter)."""
    if SPLIT_K == 1:
        k_start = 0
        k_end = K
    else:
        k_start = tl.program_id(2) * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
    return k_start, k_end


@triton.jit
def store_split_tile(out_ptr, acc, offs_m, offs_n, mask_m, mask_n, stride_om, stride_os, SPLIT_K: tl.constexpr):
    """Store the (BM, BN) fp32 ``acc`` at rows ``offs_m``, columns ``offs_n`` of the output,
    or of this split's fp32 partial ``out[program_id(2)]`` (SPLIT_K, M, N) with a split."""
    if SPLIT_K > 1:
        out_ptr += tl.program_id(2) * stride_os
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _int4_matmul_kernel(
    x_ptr,
    qw_ptr,
    scales_ptr,
    zeros_ptr,
    gidx_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_qk,
    stride_sg,
    stride_zg,
    stride_om,
    stride_os,
    k_per_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    k_start, k_end = split_k_range(K, k_per_split, SPLIT_K)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < k_end
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0
        )  # (BM, BK)
        if GROUP_SIZE > 0:
            group = k0 // GROUP_SIZE  # the whole K tile's group
            scale = tl.load(scales_ptr + group * stride_sg + offs_n, mask=mask_n, other=0.0)  # (BN,)
            zero = tl.load(zeros_ptr + group * stride_zg + offs_n, mask=mask_n, other=0).to(tl.int32)  # (BN,)
            offs_w = k0 // 8 + tl.arange(0, BLOCK_K // 8)
            mask_w = (offs_w < k_end // 8)[:, None] & mask_n[None, :]
            words = tl.load(qw_ptr + offs_w[:, None] * stride_qk + offs_n[None, :], mask=mask_w, other=0)  # (BK/8, BN)
            nibbles = (words[:, None, :] >> (tl.arange(0, 8) * 4)[None, :, None]) & 0xF  # (BK/8, 8, BN)
            q = tl.reshape(nibbles, (BLOCK_K, BLOCK_N)) - zero[None, :]  # row 8 * w + i: nibble i of word row w
            if FP32_DOT:
                part = tl.dot(x.to(tl.float32), q.to(tl.float32), input_precision="ieee")
            else:
                part = tl.dot(x, q.to(x.dtype))  # (BM, BN) fp32 from the tensor cores
            acc += part * scale.to(tl.float32)[None, :]
        else:
            mask_kn = mask_k[:, None] & mask_n[None, :]
            words = tl.load(qw_ptr + (offs_k // 8)[:, None] * stride_qk + offs_n[None, :], mask=mask_kn, other=0)
            q = (words >> ((offs_k % 8) * 4)[:, None]) & 0xF  # (BK, BN)
            groups = tl.load(gidx_ptr + offs_k, mask=mask_k, other=0)
            scale = tl.load(scales_ptr + groups[:, None] * stride_sg + offs_n[None, :], mask=mask_kn, other=0.0)
            zero = tl.load(zeros_ptr + groups[:, None] * stride_zg + offs_n[None, :], mask=mask_kn, other=0)
            w = (q - zero.to(tl.int32)).to(tl.float32) * scale.to(tl.float32)  # (BK, BN)
            if FP32_DOT:
                acc += tl.dot(x.to(tl.float32), w, input_precision="ieee")
            else:
                acc += tl.dot(x, w.to(x.dtype))
    store_split_tile(out_ptr, acc, offs_m, offs_n, mask_m, mask_n, stride_om, stride_os, SPLIT_K)


@triton.jit
def _sum_splits_kernel(partials_ptr, out_ptr, numel, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = sum over s of partials[s, i] in fp32, rounded once to out's dtype."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        acc += tl.load(partials_ptr + s * numel + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


SUM_BLOCK = 1024  # outputs per program of the split-K reduction


def fast_path_tiles(tiles: Int4Tiles, group_size: int) -> Int4Tiles | None:
    """``tiles`` fitted to the contiguous-groups path: BLOCK_K cut to the group where the
    group is a smaller power of two; None where no K tile can lie inside one group (the
    group not a multiple of 16), so the general path runs."""
    if group_size <= 0:
        return None
    if group_size % tiles.block_k == 0:
        return tiles
    if group_size >= 16 and group_size & (group_size - 1) == 0 and group_size < tiles.block_k:
        return dataclasses.replace(tiles, block_k=group_size)
    return None


def int4_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor,
    tiles: Int4Tiles | None = None,
    group_size: int = 0,
) -> torch.Tensor:
    """x (M, K) @ W -> (M, N) in x's dtype; W given as qweight (K/8, N) int32, scales (G, N),
    zeros (G, N) uint8 and g_idx (K,) int32 (the layout of ``int4.py``). ``tiles`` None: the
    tuned table's config for this device and shape, else the heuristic's (``int4_tiles.py``).
    ``group_size`` > 0 promises contiguous groups of that size (``int4.contiguous_group_size``,
    found at load): the fast path (module docstring); 0: the general path through ``g_idx``."""
    device = x.device
    _check_inputs(x, qweight, scales, zeros, g_idx)
    m, k = x.shape
    n = qweight.shape[1]
    dtype_name = str(x.dtype).removeprefix("torch.")
    given, facts = tiles, device_facts(device)
    tiles = given or choose_tiles(m, n, k, k // scales.shape[0], dtype_name, facts, act_order=group_size <= 0)
    fast = fast_path_tiles(tiles, group_size)
    if fast is not None:
        require(group_size * scales.shape[0] == k, f"group_size {group_size} x {scales.shape[0]} groups != K={k}")
        tiles = fast
    elif given is None and group_size > 0:  # a group no K tile fits in: the general path's tiles
        tiles = choose_tiles(m, n, k, k // scales.shape[0], dtype_name, facts, act_order=True)
    splits = tiles.splits(k)
    out = split_k_output(splits, m, n, x.dtype, device)
    grid = (triton.cdiv(m, tiles.block_m), triton.cdiv(n, tiles.block_n), splits)
    _int4_matmul_kernel[grid](
        x,
        qweight,
        scales,
        zeros,
        g_idx,
        out,
        m,
        n,
        k,
        x.stride(0),
        qweight.stride(0),
        scales.stride(0),
        zeros.stride(0),
        n,
        m * n,
        tiles.k_per_split(k),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        SPLIT_K=splits,
        GROUP_SIZE=group_size if fast is not None else 0,
        FP32_DOT=device.type != "cuda" or x.dtype == torch.float32,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return add_splits(out, x.dtype) if splits > 1 else out


def split_k_output(splits: int, m: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """What a split-K GEMM kernel stores into: the (M, N) output in ``dtype`` itself without a
    split, else (S, M, N) fp32 partials for ``add_splits`` (the int4 and fp8 GEMMs)."""
    if splits == 1:
        return torch.empty(m, n, dtype=dtype, device=device)
    return torch.empty(splits, m, n, dtype=torch.float32, device=device)


def add_splits(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(S, M, N) fp32 split-K partials -> their sum (M, N) in ``dtype``, added in fp32 and
    rounded once, in one launch (the int4 and fp8 GEMMs' reduction)."""
    splits, m, n = partials.shape
    out = torch.empty(m, n, dtype=dtype, device=partials.device)
    _sum_splits_kernel[(triton.cdiv(m * n, SUM_BLOCK),)](partials, out, m * n, SPLITS=splits, BLOCK=SUM_BLOCK)
    return out


def _check_inputs(x, qweight, scales, zeros, g_idx) -> None:
    device = x.device
    for t, name, dims in (
        (x, "x", 2),
        (qweight, "qweight", 2),
        (scales, "scales", 2),
        (zeros, "zeros", 2),
        (g_idx, "g_idx", 1),
    ):
        check_tensor(t, name, device, dims)
    check_launchable(device, _int4_matmul_kernel)
    m, k = x.shape
    n = qweight.shape[1]
    require(x.dtype in SUPPORTED_DTYPES, f"x dtype {x.dtype}: allowed {SUPPORTED_DTYPES}")
    require(
        qweight.dtype == torch.int32 and qweight.shape[0] * 8 == k,
        f"qweight must be int32 (K/8, N) = ({k // 8}, N), got {qweight.dtype} {tuple(qweight.shape)}",
    )
    require(
        scales.shape[1] == n and zeros.shape == scales.shape,
        f"scales {tuple(scales.shape)} and zeros {tuple(zeros.shape)} must both be (G, {n})",
    )
    require(zeros.dtype == torch.uint8, f"zeros must be uint8, got {zeros.dtype}")
    require(
        g_idx.dtype == torch.int32 and g_idx.shape[0] == k,
        f"g_idx must be int32 ({k},), got {g_idx.dtype} {tuple(g_idx.shape)}",
    )
