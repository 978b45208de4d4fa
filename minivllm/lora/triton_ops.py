"""Triton LoRA shrink and expand: ``x[idx] @ A[slot]`` then ``(.) @ B[slot]`` per slot segment.

Both are one segmented, gathered matmul: the step's tokens that use an adapter
are listed slot by slot (``token_idx``, with segment ``i`` covering entries
``seg_start[i] : seg_start[i] + seg_len[i]``, all of slot ``seg_slot[i]``). A
program takes BLOCK_M tokens of one segment and BLOCK_N output columns, gathers
the tokens' rows of ``x``, multiplies with its slot's weight tile by tile and
writes (shrink) or adds (expand) the rows back at the same token positions.
Every token is in at most one segment, so the adds never race.
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from minivllm.attention.ops.checks import SUPPORTED_DTYPES, check_launchable, check_tensor, require


@triton.jit
def _segmented_matmul_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    idx_ptr,
    seg_slot_ptr,
    seg_start_ptr,
    seg_len_ptr,
    N,
    K,
    stride_xm,
    stride_ws,
    stride_wk,
    stride_om,
    ADD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    seg, pid_m, pid_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(seg_len_ptr + seg)
    if pid_m * BLOCK_M >= length:
        return
    slot = tl.load(seg_slot_ptr + seg).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < length
    tokens = tl.load(idx_ptr + tl.load(seg_start_ptr + seg) + offs_m, mask=mask_m, other=0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(
            x_ptr + tokens[:, None] * stride_xm + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0
        )  # (BM, BK)
        w = tl.load(
            w_ptr + slot * stride_ws + offs_k[:, None] * stride_wk + offs_n[None, :],
            mask=mask_k[:, None] & mask_n[None, :],
            other=0.0,
        )  # (BK, BN)
        if FP32_DOT:
            acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x, w.to(x.dtype))
    out = out_ptr + tokens[:, None] * stride_om + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if ADD:
        acc += tl.load(out, mask=mask, other=0.0).to(tl.float32)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


def block_config(n: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K) for a (.., K) @ (K, N) product: 16 tokens a program, N and K
    tiles of 16 to 64 (also read by ``tools/kernel_report.py``)."""
    block_n, block_k = (max(16, min(64, triton.next_power_of_2(d))) for d in (n, k))
    return 16, block_n, block_k


def segmented_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    token_idx: torch.Tensor,
    seg_slot: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    max_len: int,
    add: bool,
) -> None:
    """For each segment, ``out[tok] (+)= x[tok] @ w[slot]`` for its tokens ``tok``, in place.

    x: (T, K); w: (slots, K, N); out: (T, N) (may be a column slice of a wider tensor);
    token_idx: (n,) int64; seg_slot, seg_start, seg_len: (segments,) int32.
    """
    device = x.device
    for t, name, dims in ((x, "x", 2), (w, "w", 3), (out, "out", 2), (token_idx, "token_idx", 1)):
        check_tensor(t, name, device, dims)
    check_launchable(device, _segmented_matmul_kernel)
    require(
        x.dtype in SUPPORTED_DTYPES and w.dtype in SUPPORTED_DTYPES,
        f"dtypes {x.dtype}, {w.dtype}: allowed {SUPPORTED_DTYPES}",
    )
    require(
        w.shape[1] == x.shape[1] and out.shape == (x.shape[0], w.shape[2]),
        f"shapes x {tuple(x.shape)}, w {tuple(w.shape)}, out {tuple(out.shape)} do not chain (T,K)@(S,K,N)->(T,N)",
    )
    require(
        seg_slot.shape == seg_start.shape == seg_len.shape,
        "seg_slot, seg_start and seg_len must have one entry per segment",
    )
    if seg_len.numel() == 0 or max_len == 0:
        return
    n, k = w.shape[2], w.shape[1]
    block_m, block_n, block_k = block_config(n, k)
    grid = (seg_len.numel(), triton.cdiv(max_len, block_m), triton.cdiv(n, block_n))
    _segmented_matmul_kernel[grid](
        x,
        w,
        out,
        token_idx,
        seg_slot,
        seg_start,
        seg_len,
        n,
        k,
        x.stride(0),
        w.stride(0),
        w.stride(1),
        out.stride(0),
        ADD=add,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        FP32_DOT=device.type != "cuda" or x.dtype == torch.float32,
    )


def lora_shrink_expand(
    out: torch.Tensor,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    token_idx: torch.Tensor,
    seg_slot: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    max_len: int,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """``out[tok] += x[tok] @ a[slot] @ b[slot]``: shrink into a (T, max_rank) fp32 buffer, then expand.
    ``reduce`` (row-parallel layers): sums the buffer over the ranks between the two."""
    buffer = torch.zeros(x.shape[0], a.shape[2], dtype=torch.float32, device=x.device)  # (T, max_rank)
    segmented_matmul(x, a, buffer, token_idx, seg_slot, seg_start, seg_len, max_len, add=False)
    if reduce is not None:
        buffer = reduce(buffer)
    segmented_matmul(buffer, b, out, token_idx, seg_slot, seg_start, seg_len, max_len, add=True)
