"""Triton q/k-norm + rotary + KV-cache write: an attention layer's work between the qkv
projection and attention, in one kernel.

Eager, a Qwen3-style layer normalises each head of q and of k (two RMSNorm kernels),
rotates both (rotary, one or two kernels), then the backend stores k and v in the
paged cache (one more). Here one program per (token, head) does all of it::

    q head:  q <- rotary(q_norm(q))                                   (in place)
    k head:  k <- rotary(k_norm(k)); cache[slot] <- k; cache[slot] <- v  (k also in place)

Without q/k norms (Llama) it is rotary + KV write. Padding tokens (slot -1) write no
KV. The roundings follow the torch layers step by step (``RMSNorm._norm``: fp32
statistics, the normalised head rounded to the model dtype, times the weight rounded
again; rotary in fp32 rounded once), so both paths agree to the last bit or close. An
fp8 KV cache keeps the separate kernels (its scaled write lives in ``triton_kv_write``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.attention.ops.checks import SUPPORTED_DTYPES, check_cache, check_launchable, check_tensor, require


@triton.jit
def _qk_norm_rope_kv_kernel(
    q_ptr,  # (T, Hq, D)
    k_ptr,  # (T, Hkv, D)
    v_ptr,  # (T, Hkv, D)
    positions_ptr,  # (T,)
    cache_ptr,  # (max_position, ROT_DIM) fp32: cosines then sines
    q_weight_ptr,  # (D,) q_norm's weight (unused without NORM)
    k_weight_ptr,  # (D,)
    kv_ptr,  # (2, num_blocks, block_size, Hkv, D)
    slot_mapping_ptr,  # (T,)
    eps,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kv,
    stride_cb,
    stride_cs,
    stride_ch,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROT_DIM: tl.constexpr,
    HALF_BLOCK: tl.constexpr,
    REST_BLOCK: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NEOX: tl.constexpr,
    NORM: tl.constexpr,
):
    """One program per (token, head): heads ``0 .. Hq-1`` of q, then the KV heads."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    is_q = h < NUM_Q_HEADS
    kh = h - NUM_Q_HEADS
    if is_q:
        base = q_ptr + t * stride_qt + h * stride_qh
        w_ptr = q_weight_ptr
    else:
        base = k_ptr + t * stride_kt + kh * stride_kh
        w_ptr = k_weight_ptr
    half = ROT_DIM // 2
    i = tl.arange(0, HALF_BLOCK)
    rot_mask = i < half
    if NEOX:
        a_off, b_off = i, i + half
    else:
        a_off, b_off = 2 * i, 2 * i + 1
    j = ROT_DIM + tl.arange(0, REST_BLOCK)  # features past the rotary ones (partial rotary)
    rest_mask = j < HEAD_DIM
    a = tl.load(base + a_off, mask=rot_mask, other=0.0)
    b = tl.load(base + b_off, mask=rot_mask, other=0.0)
    rest = tl.load(base + j, mask=rest_mask, other=0.0)
    dtype = a.dtype
    a32, b32, rest32 = a.to(tl.float32), b.to(tl.float32), rest.to(tl.float32)
    if NORM:
        total = tl.sum(a32 * a32, axis=0) + tl.sum(b32 * b32, axis=0) + tl.sum(rest32 * rest32, axis=0)
        rstd = 1.0 / tl.sqrt(total / HEAD_DIM + eps)
        wa = tl.load(w_ptr + a_off, mask=rot_mask, other=0.0).to(tl.float32)
        wb = tl.load(w_ptr + b_off, mask=rot_mask, other=0.0).to(tl.float32)
        wr = tl.load(w_ptr + j, mask=rest_mask, other=0.0).to(tl.float32)
        a32 = (wa * (a32 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        b32 = (wb * (b32 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        rest32 = (wr * (rest32 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    cos = tl.load(cache_ptr + pos * ROT_DIM + i, mask=rot_mask, other=0.0)
    sin = tl.load(cache_ptr + pos * ROT_DIM + half + i, mask=rot_mask, other=0.0)
    out_a = (a32 * cos - b32 * sin).to(dtype)
    out_b = (b32 * cos + a32 * sin).to(dtype)
    out_rest = rest32.to(dtype)
    tl.store(base + a_off, out_a, mask=rot_mask)
    tl.store(base + b_off, out_b, mask=rot_mask)
    tl.store(base + j, out_rest, mask=rest_mask)
    if not is_q:
        slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
        if slot >= 0:  # padding tokens write nothing
            cell = kv_ptr + (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + kh * stride_ch
            tl.store(cell + a_off, out_a.to(kv_ptr.dtype.element_ty), mask=rot_mask)
            tl.store(cell + b_off, out_b.to(kv_ptr.dtype.element_ty), mask=rot_mask)
            tl.store(cell + j, out_rest.to(kv_ptr.dtype.element_ty), mask=rest_mask)
            d = tl.arange(0, BLOCK_D)
            v = tl.load(v_ptr + t * stride_vt + kh * stride_vh + d, mask=d < HEAD_DIM)
            tl.store(cell + stride_kv + d, v.to(kv_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def launch_constexprs(num_q_heads: int, head_dim: int, rot_dim: int, block_size: int, neox: bool, norm: bool) -> dict:
    """The kernel's compile-time arguments (also read by ``tools/kernel_report.py``)."""
    return dict(
        NUM_Q_HEADS=num_q_heads,
        HEAD_DIM=head_dim,
        ROT_DIM=rot_dim,
        HALF_BLOCK=triton.next_power_of_2(rot_dim // 2),
        REST_BLOCK=triton.next_power_of_2(max(1, head_dim - rot_dim)),
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
        NEOX=neox,
        NORM=norm,
    )


def qk_norm_rope_write_kv_(
    positions: torch.Tensor,  # (T,) int
    q: torch.Tensor,  # (T, Hq, D)
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,  # (T, Hkv, D)
    cos_sin_cache: torch.Tensor,  # (max_position, rotary_dim) fp32
    neox_style: bool,
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hkv, D)
    slot_mapping: torch.Tensor,  # (T,) int, -1: padding
    q_weight: torch.Tensor | None = None,  # (D,) with k_weight: normalise each head first
    k_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> None:
    """In place: each head of ``q`` and ``k`` normalised (when the weights are given) and
    rotated; ``k`` and ``v`` stored in ``kv_cache`` at their tokens' slots."""
    device = q.device
    check_launchable(device, _qk_norm_rope_kv_kernel)
    check_tensor(positions, "positions", device, dims=1)
    check_tensor(slot_mapping, "slot_mapping", device, dims=1)
    check_tensor(cos_sin_cache, "cos_sin_cache", device, dims=2)
    T, num_q_heads, head_dim = q.shape
    rot_dim = cos_sin_cache.shape[1]
    require(
        cos_sin_cache.dtype == torch.float32 and rot_dim % 2 == 0 and rot_dim <= head_dim,
        f"cos_sin_cache must be (max_position, even rotary_dim <= {head_dim}) fp32, got "
        f"{tuple(cos_sin_cache.shape)} {cos_sin_cache.dtype}",
    )
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(x, name, device, dims=3)
        require(x.dtype in SUPPORTED_DTYPES, f"{name} dtype must be one of {SUPPORTED_DTYPES}, got {x.dtype}")
        require(
            x.shape[0] == T and x.shape[2] == head_dim and x.dtype == q.dtype,
            f"{name} must be ({T}, heads, {head_dim}) {q.dtype}, got {tuple(x.shape)} {x.dtype}",
        )
    require(k.shape == v.shape, f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    require(
        positions.shape[0] == T and slot_mapping.shape[0] == T,
        f"positions and slot_mapping must have {T} entries, got {positions.shape[0]} and {slot_mapping.shape[0]}",
    )
    check_cache(kv_cache, device, q.dtype, k.shape[1], head_dim)
    require(
        kv_cache.dtype == q.dtype, f"kv_cache must be {q.dtype} (an fp8 cache takes write_kv), got {kv_cache.dtype}"
    )
    norm = q_weight is not None
    require(norm == (k_weight is not None), "q_weight and k_weight come together (both norms or neither)")
    if norm:
        for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
            check_tensor(w, name, device, dims=1)
            require(
                w.shape[0] == head_dim and w.dtype == q.dtype,
                f"{name} must be ({head_dim},) {q.dtype}, got {tuple(w.shape)} {w.dtype}",
            )
    if T == 0:
        return
    _qk_norm_rope_kv_kernel[(T, num_q_heads + k.shape[1])](
        q,
        k,
        v,
        positions,
        cos_sin_cache,
        q_weight if norm else cos_sin_cache,
        k_weight if norm else cos_sin_cache,
        kv_cache,
        slot_mapping,
        eps,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        *kv_cache.stride()[:4],
        **launch_constexprs(num_q_heads, head_dim, rot_dim, kv_cache.shape[2], neox_style, norm),
    )
