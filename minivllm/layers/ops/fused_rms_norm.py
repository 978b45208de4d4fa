"""Triton RMSNorm, optionally fused with the residual add that precedes it.

Pre-norm decoder layers compute ``s = x + residual`` and then ``norm(s)`` between
sublayers; eager torch spends five kernels and two round trips through memory
on it. This kernel reads each row once and writes both results in place::

    residual <- x + residual            (rounded to the model dtype, as torch does)
    x        <- weight * (s * rsqrt(mean(s^2) + eps))

The arithmetic follows ``layers.norm.RMSNorm`` step by step (fp32 statistics,
roundings at the same points), so both paths agree to the last bit or close. With
``GEMMA`` it follows ``GemmaRMSNorm`` instead: ``(s * rstd) * (1 + weight)`` in fp32,
rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.attention.ops.checks import SUPPORTED_DTYPES, check_launchable, check_tensor, require


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,  # x, residual: (N, H); weight: (H,)
    stride_x,
    stride_r,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    GEMMA: tl.constexpr,
):
    """One program per row."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
        tl.store(residual_ptr + row * stride_r + cols, x, mask=mask)
    s = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / HIDDEN + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if GEMMA:
        out = (s * rstd) * (1.0 + w)
    else:
        out = w * (s * rstd).to(dtype).to(tl.float32)
    tl.store(x_ptr + row * stride_x + cols, out.to(dtype), mask=mask)


def launch_constexprs(hidden: int, has_residual: bool, gemma: bool = False) -> dict:
    """The kernel's compile-time arguments for rows of ``hidden`` features: one block holds a
    whole row (also read by ``tools/kernel_report.py``)."""
    return dict(HIDDEN=hidden, BLOCK=triton.next_power_of_2(hidden), HAS_RESIDUAL=has_residual, GEMMA=gemma)


def rms_norm_(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None, gemma: bool = False
) -> None:
    """In place: ``x`` (N, H) becomes ``weight * rmsnorm(x [+ residual])`` (``(1 + weight) * ...``
    with ``gemma``); with ``residual`` (N, H), it becomes ``x + residual`` first."""
    device = x.device
    check_launchable(device, _rms_norm_kernel)
    check_tensor(x, "x", device, dims=2)
    check_tensor(weight, "weight", device, dims=1)
    n, hidden = x.shape
    require(x.dtype in SUPPORTED_DTYPES, f"x dtype must be one of {SUPPORTED_DTYPES}, got {x.dtype}")
    require(
        weight.shape[0] == hidden and weight.dtype == x.dtype,
        f"weight must be ({hidden},) {x.dtype}, got {tuple(weight.shape)} {weight.dtype}",
    )
    if residual is not None:
        check_tensor(residual, "residual", device, dims=2)
        require(
            residual.shape == x.shape and residual.dtype == x.dtype,
            f"residual must be {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} {residual.dtype}",
        )
    if n == 0:
        return
    _rms_norm_kernel[(n,)](
        x,
        residual if residual is not None else x,
        weight,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        eps,
        **launch_constexprs(hidden, residual is not None, gemma),
    )
