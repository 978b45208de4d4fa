"""Triton fp8 (e4m3) W8A8 GEMM: ``y = (x_fp8 * x_scale) @ (w_fp8 * w_scale)^T`` on the fp8
tensor cores, for what ``torch._scaled_mm``'s row-wise path cannot do.

``_scaled_mm`` with a scale per token and per output channel wants bf16 output; an fp16
or fp32 model would otherwise dequantize the whole fp8 weight at every call (the
reference path). This kernel takes the same operands as the row-wise ``_scaled_mm``:

    x_fp8    (M, K) float8_e4m3fn    activations, quantized per token (or with the
                                     static scale) by ``triton_fp8_quant.py``
    x_scale  (M, 1) fp32             each token's scale
    weight   (N, K) float8_e4m3fn    the checkpoint's layout, read as is (K contiguous)
    w_scale  (N,) fp32               each output channel's scale

A program computes one (BLOCK_M, BLOCK_N) tile: fp8 x fp8 products accumulated in fp32,
then scaled by ``x_scale[m] * w_scale[n]`` (the scales factor out of the sum over K), the
bias added, rounded once to the output dtype. At small M the grid is short, so K is split
as in the int4 GEMM (``int4_tiles.default_split``): each split scales its fp32 partial (the
bias in split 0 only) and ``triton_int4.add_splits`` adds them in fp32 in one launch; the
K range, the split's store and the partials' buffer are the int4 GEMM's own helpers.
Tiles by M (``fp8_tiles``): the int4 GEMM's reasoning, with twice the weight bytes per
element (BLOCK_K 128 at decode: 8 KiB of weight a K step).

Which GEMM a bf16 fp8 linear runs is the tuned table's call (``choose_gemm``):
``benchmarks/quant_gemm.py --tune`` times ``_scaled_mm`` against this kernel at a few
tiles for each weight shape and M bucket and writes the winner into
``minivllm/tuned_tiles/tables/fp8_gemm.json`` (``{"backend": "scaled_mm"}`` or
``{"backend": "triton", <tiles>}``); without an entry bf16 takes ``_scaled_mm``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.attention.ops.checks import check_fp8_capability, check_launchable, check_tensor, require
from minivllm.quantization.int4_tiles import Int4Tiles, default_split
from minivllm.quantization.triton_int4 import add_splits, split_k_output, split_k_range, store_split_tile
from minivllm.tuned_tiles import DeviceFacts, device_facts, lookup

FP8 = torch.float8_e4m3fn
KERNEL = "fp8_gemm"
OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _fp8_gemm_kernel(
    x_ptr,  # (M, K) fp8
    w_ptr,  # (N, K) fp8
    x_scale_ptr,  # (M,) fp32
    w_scale_ptr,  # (N,) fp32
    bias_ptr,  # (N,) or a stand-in when not HAS_BIAS
    out_ptr,  # (M, N) out dtype, or (SPLIT_K, M, N) fp32 partials
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    stride_os,
    k_per_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
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
        w = tl.load(
            w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None], mask=mask_k[:, None] & mask_n[None, :], other=0.0
        )  # (BK, BN): the (N, K) weight read transposed
        if FP32_DOT:
            acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x, w)
    x_scale = tl.load(x_scale_ptr + offs_m, mask=mask_m, other=0.0)
    w_scale = tl.load(w_scale_ptr + offs_n, mask=mask_n, other=0.0)
    acc = acc * x_scale[:, None] * w_scale[None, :]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        if SPLIT_K == 1:
            acc += bias[None, :]
        else:
            acc += bias[None, :] * (tl.program_id(2) == 0).to(tl.float32)  # once, in split 0
    store_split_tile(out_ptr, acc, offs_m, offs_n, mask_m, mask_n, stride_om, stride_os, SPLIT_K)


def fp8_tiles(m: int, n: int, k: int, arch: int | None, num_sms: int) -> Int4Tiles:
    """The config for an (M, K) x (K, N) fp8 product on sm_``arch`` with ``num_sms`` SMs:
    16 x 64 x 128 with K split to two programs an SM up to M = 16, 32/64 x 64 x 128 to 64,
    64 x 128 x 128 to 256 (K split to one program an SM), then 128 x 128 x 128 with 8 warps."""
    stages = 4 if (arch or 0) >= 90 else 3
    if m <= 64:
        bm = 16 if m <= 16 else (32 if m <= 32 else 64)
        return Int4Tiles(bm, 64, 128, default_split(m, n, k, bm, 64, 128, num_sms), 4, stages)
    bm, bn, warps = (64, 128, 4) if m <= 256 else (128, 128, 8)
    return Int4Tiles(bm, bn, 128, default_split(m, n, k, bm, bn, 128, num_sms, per_sm=1), warps, stages)


def shape_key(n: int, k: int, dtype_name: str) -> str:
    """The tuned table's key of a weight: K inputs, N outputs, the activations' dtype."""
    return f"N={n},K={k},{dtype_name}"


def choose_gemm(m: int, n: int, k: int, dtype_name: str, device: DeviceFacts) -> Int4Tiles | None:
    """The Triton kernel's tiles where it runs, None where ``_scaled_mm`` does: the tuned
    table's entry nearest to ``m``; without one ``_scaled_mm`` for bf16, ``fp8_tiles`` else."""
    tuned = lookup(KERNEL, device.name, shape_key(n, k, dtype_name), m)
    if tuned is None:
        return None if dtype_name == "bfloat16" else fp8_tiles(m, n, k, device.arch, device.num_sms)
    if tuned.get("backend") == "scaled_mm":
        return None
    return Int4Tiles(**{key: v for key, v in tuned.items() if key != "backend"})


def tune_candidates(m: int, n: int, k: int, arch: int | None, num_sms: int) -> list[Int4Tiles]:
    """The Triton configs ``benchmarks/quant_gemm.py --tune`` times against ``_scaled_mm``:
    ``fp8_tiles``' pick, half and double its splits, a wider N tile (at most 4)."""
    base = fp8_tiles(m, n, k, arch, num_sms)
    out = [
        base,
        Int4Tiles(base.block_m, base.block_n, base.block_k, max(1, base.split_k // 2), base.num_warps, base.num_stages),
        Int4Tiles(base.block_m, base.block_n, base.block_k, min(16, base.split_k * 2), base.num_warps, base.num_stages),
        Int4Tiles(base.block_m, 128, base.block_k, max(1, base.split_k // 2), base.num_warps, base.num_stages),
    ]
    return list(dict.fromkeys(out))


def fp8_gemm(
    x_fp8: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    tiles: Int4Tiles | None = None,
) -> torch.Tensor:
    """(M, K) fp8 activations with (M, 1) fp32 scales times the (N, K) fp8 weight with (N,)
    fp32 scales -> (M, N) in ``out_dtype`` (module docstring). ``tiles`` None: ``fp8_tiles``."""
    device = x_fp8.device
    _check_inputs(x_fp8, x_scale, weight, w_scale, out_dtype, bias)
    m, k = x_fp8.shape
    n = weight.shape[0]
    facts = device_facts(device)
    tiles = tiles or fp8_tiles(m, n, k, facts.arch, facts.num_sms)
    if m == 0:
        return torch.empty(0, n, dtype=out_dtype, device=device)
    splits = tiles.splits(k)
    out = split_k_output(splits, m, n, out_dtype, device)
    grid = (triton.cdiv(m, tiles.block_m), triton.cdiv(n, tiles.block_n), splits)
    _fp8_gemm_kernel[grid](
        x_fp8,
        weight,
        x_scale,
        w_scale,
        bias if bias is not None else w_scale,
        out,
        m,
        n,
        k,
        x_fp8.stride(0),
        weight.stride(0),
        n,
        m * n,
        tiles.k_per_split(k),
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        SPLIT_K=splits,
        HAS_BIAS=bias is not None,
        FP32_DOT=device.type != "cuda",
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return add_splits(out, out_dtype) if splits > 1 else out


def check_fp8_gemm_capability(capability: tuple[int, int]) -> None:
    """Refuse a GPU of compute ``capability`` without fp8 tensor cores."""
    check_fp8_capability(
        capability, "the fp8 GEMM needs", "below it fp8 linears dequantize their weights instead (the reference path)"
    )


def _check_inputs(x_fp8, x_scale, weight, w_scale, out_dtype, bias) -> None:
    device = x_fp8.device
    check_launchable(device, _fp8_gemm_kernel)
    if device.type == "cuda":
        check_fp8_gemm_capability(torch.cuda.get_device_capability(device))
    check_tensor(x_fp8, "x_fp8", device, 2)
    check_tensor(weight, "weight", device, 2)
    m, k = x_fp8.shape
    n = weight.shape[0]
    require(
        x_fp8.dtype == FP8 and weight.dtype == FP8, f"x_fp8 and weight must be {FP8}: {x_fp8.dtype}, {weight.dtype}"
    )
    require(weight.shape[1] == k, f"weight must be (N, K={k}), got {tuple(weight.shape)}")
    _check_scale(x_scale, "x_scale", f"({m}, 1)", m, device)
    _check_scale(w_scale, "w_scale", f"({n},)", n, device)
    require(out_dtype in OUT_DTYPES, f"out_dtype {out_dtype}: allowed {OUT_DTYPES}")
    if bias is not None:
        check_tensor(bias, "bias", device, 1)
        require(bias.shape[0] == n, f"bias must be ({n},), got {tuple(bias.shape)}")


def _check_scale(scale: torch.Tensor, name: str, shape: str, numel: int, device: torch.device) -> None:
    """A scale per token or per output channel: ``numel`` contiguous fp32 values on ``device``."""
    require(
        scale.device == device and scale.dtype == torch.float32 and scale.numel() == numel and scale.is_contiguous(),
        f"{name} must be {shape} contiguous fp32 on {device}, got {scale.dtype} {tuple(scale.shape)}",
    )
