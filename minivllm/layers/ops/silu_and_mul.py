"""Triton SiLU-and-multiply: ``silu(gate) * up`` over a gate_up projection's output in one kernel.

Eager torch runs ``F.silu(gate)`` then ``mul_(up)``: two launches and a round trip
of the (T, I) intermediate through memory. This kernel reads ``[gate | up]`` once
and writes the product. The roundings follow ``layers.activation.ActAndMul``
(SiLU in fp32, rounded to the model dtype, then the product in fp32, rounded), so
both paths agree to the last bit or close.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.attention.ops.checks import SUPPORTED_DTYPES, check_launchable, check_tensor, require

BLOCK = 1024  # features of one row per program


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # (T, 2 * I): [gate | up]
    out_ptr,  # (T, I)
    stride_x,
    stride_out,
    INTER: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per (token, block of BLOCK features)."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    gate = tl.load(x_ptr + t * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + t * stride_x + INTER + cols, mask=mask, other=0.0)
    dtype = gate.dtype
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(out_ptr + t * stride_out + cols, (silu * up.to(tl.float32)).to(dtype), mask=mask)


def launch_constexprs(inter: int) -> dict:
    """The kernel's compile-time arguments for an intermediate size ``inter`` (also read by
    ``tools/kernel_report.py``)."""
    return dict(INTER=inter, BLOCK=min(BLOCK, triton.next_power_of_2(inter)))


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` (T, 2I) ``[gate | up]`` -> (T, I) ``silu(gate) * up`` (into ``out`` when given)."""
    device = x.device
    check_launchable(device, _silu_and_mul_kernel)
    check_tensor(x, "x", device, dims=2)
    require(x.dtype in SUPPORTED_DTYPES, f"x dtype must be one of {SUPPORTED_DTYPES}, got {x.dtype}")
    tokens, width = x.shape
    require(width % 2 == 0, f"x must be (T, 2 * intermediate) [gate | up], got {tuple(x.shape)}")
    inter = width // 2
    if out is None:
        out = torch.empty(tokens, inter, dtype=x.dtype, device=device)
    check_tensor(out, "out", device, dims=2)
    require(
        tuple(out.shape) == (tokens, inter) and out.dtype == x.dtype,
        f"out must be ({tokens}, {inter}) {x.dtype}, got {tuple(out.shape)} {out.dtype}",
    )
    if tokens == 0:
        return out
    constexprs = launch_constexprs(inter)
    _silu_and_mul_kernel[(tokens, triton.cdiv(inter, constexprs["BLOCK"]))](
        x, out, x.stride(0), out.stride(0), **constexprs
    )
    return out
