"""Triton rotary embedding applied to queries and keys in place.

Each program rotates one head of one token, reading cos and sin for the token's
position from a cache computed once per model (``(max_position, rotary_dim)``:
the cosines in the first half of a row, the sines in the second)::

    neox (Llama):   x = [a | b | rest]        -> [a cos - b sin | b cos + a sin | rest]
    GPT-J:          x = [a0 b0 a1 b1 .. rest] -> pairs (a_i, b_i) rotated alike

Features past ``rotary_dim`` (partial rotary) are left as they are. The math is
fp32 with one rounding at the end, like ``layers.rotary.RotaryEmbedding``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.attention.ops.checks import SUPPORTED_DTYPES, check_launchable, check_tensor, require


@triton.jit
def _rotary_kernel(
    x_ptr,  # (T, H, D)
    positions_ptr,  # (T,)
    cache_ptr,  # (max_position, ROT_DIM) fp32
    stride_xt,
    stride_xh,
    ROT_DIM: tl.constexpr,
    HALF_BLOCK: tl.constexpr,
    NEOX: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    half = ROT_DIM // 2
    i = tl.arange(0, HALF_BLOCK)
    mask = i < half
    pos = tl.load(positions_ptr + t).to(tl.int64)
    cos = tl.load(cache_ptr + pos * ROT_DIM + i, mask=mask, other=0.0)
    sin = tl.load(cache_ptr + pos * ROT_DIM + half + i, mask=mask, other=0.0)
    base = x_ptr + t * stride_xt + h * stride_xh
    if NEOX:
        a_off, b_off = i, i + half
    else:
        a_off, b_off = 2 * i, 2 * i + 1
    a = tl.load(base + a_off, mask=mask, other=0.0)
    b = tl.load(base + b_off, mask=mask, other=0.0)
    dtype = a.dtype
    a32, b32 = a.to(tl.float32), b.to(tl.float32)
    tl.store(base + a_off, (a32 * cos - b32 * sin).to(dtype), mask=mask)
    tl.store(base + b_off, (b32 * cos + a32 * sin).to(dtype), mask=mask)


def launch_constexprs(rot_dim: int, neox_style: bool) -> dict:
    """The kernel's compile-time arguments: a program holds one head's ``rot_dim // 2`` pairs
    (also read by ``tools/kernel_report.py``)."""
    return dict(ROT_DIM=rot_dim, HALF_BLOCK=triton.next_power_of_2(rot_dim // 2), NEOX=neox_style)


def rotary_embedding_(
    positions: torch.Tensor,  # (T,) int
    q: torch.Tensor,  # (T, Hq, D)
    k: torch.Tensor,  # (T, Hk, D)
    cos_sin_cache: torch.Tensor,  # (max_position, rotary_dim) fp32
    neox_style: bool,
) -> None:
    """Rotate the first ``rotary_dim`` features of every head of ``q`` and ``k``, in place."""
    device = q.device
    check_launchable(device, _rotary_kernel)
    check_tensor(positions, "positions", device, dims=1)
    check_tensor(cos_sin_cache, "cos_sin_cache", device, dims=2)
    rot_dim = cos_sin_cache.shape[1]
    require(
        cos_sin_cache.dtype == torch.float32 and rot_dim % 2 == 0,
        f"cos_sin_cache must be (max_position, even rotary_dim) fp32, got {tuple(cos_sin_cache.shape)} "
        f"{cos_sin_cache.dtype}",
    )
    for name, x in (("q", q), ("k", k)):
        check_tensor(x, name, device, dims=3)
        require(x.dtype in SUPPORTED_DTYPES, f"{name} dtype must be one of {SUPPORTED_DTYPES}, got {x.dtype}")
        require(x.shape[0] == positions.shape[0], f"{name} has {x.shape[0]} tokens, positions {positions.shape[0]}")
        require(rot_dim <= x.shape[2], f"rotary_dim {rot_dim} exceeds {name}'s head_dim {x.shape[2]}")
    if positions.shape[0] == 0:
        return
    for x in (q, k):
        _rotary_kernel[(x.shape[0], x.shape[1])](
            x,
            positions,
            cos_sin_cache,
            x.stride(0),
            x.stride(1),
            **launch_constexprs(rot_dim, neox_style),
        )
