"""Triton fp8 (e4m3) activation quantization: one launch per linear instead of nine.

Before ``torch._scaled_mm`` each token row ``x`` of an fp8 linear is quantized as
``quantize_activations`` does it with torch ops (the reference)::

    dynamic:  scale = max(amax(|x|) * (1 / 448), 1e-12)  one fp32 scale per row
    static:   scale = the checkpoint's input_scale       the same for every row
    x_fp8     = fp8(clamp(x / scale, -448, 448))         round to nearest even

Eager torch spends nine kernels on it (abs, amax, three casts, the scale, the
division, two clamps; five with a static scale, its expand included); at decode
sizes those launches cost more than the GEMM. Here one program reads one row,
keeps it in registers when it fits one tile (hidden <= MAX_BLOCK; a longer row
is read twice, tile by tile), and writes its fp8 values and its scale. The
arithmetic is the reference's step by step (an fp32 amax; its product with the
fp32 reciprocal of 448, which is what torch computes on CUDA for ``amax / 448``;
an IEEE division by the scale; the same clamps; round to nearest even), so both
give the same bits for finite rows. Rows holding NaN or inf are outside that
promise: the reference's amax spreads a NaN over the whole row, the kernel's
skips it, and the bits of an fp8 NaN differ between devices.

Triton has float8_e4m3fn (its fp8e4nv) from compute capability 8.9 on, where
the fp8 GEMM is used at all (``_scaled_mm_usable``); below that this kernel
does not compile and the wrapper refuses (``check_fp8_quant_capability``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.attention.ops.checks import (
    SUPPORTED_DTYPES,
    check_fp8_capability,
    check_launchable,
    check_tensor,
    is_interpreted,
    require,
)
from minivllm.attention.ops.triton_kv_write import _round_to_e4m3

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448, the largest float8_e4m3fn value
FP8_MIN_SCALE = 1e-12
"""A dynamic activation scale's floor: a row of zeros is divided by it."""
MAX_BLOCK = 16384  # columns of a row one program holds at once (32 per thread at 16 warps)
_MAX = tl.constexpr(FP8_MAX)
_INV_MAX = tl.constexpr(1.0 / FP8_MAX)  # rounded to fp32 where it meets the fp32 amax
_MIN_SCALE = tl.constexpr(FP8_MIN_SCALE)


def quantize_activations(
    x2: torch.Tensor, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, in) -> its fp8 values (tokens, in) and (tokens, 1) fp32 scales: with
    ``input_scale`` (1,) fp32 that static scale for every token, else one per token.
    The torch reference of ``quantize_fp8_rows`` (module docstring)."""
    if input_scale is not None:
        x_scale = input_scale.expand(x2.shape[0], 1).contiguous()
    else:  # times the fp32 reciprocal: CUDA's division by a Python number, spelled out for every device
        x_scale = (x2.abs().amax(dim=-1, keepdim=True).float() * (1.0 / FP8_MAX)).clamp(min=FP8_MIN_SCALE)
    return (x2.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), x_scale


@triton.jit
def _quantize_tile(x, scale, ROUND_FP8: tl.constexpr):
    """fp32 ``x`` / ``scale``, clamped to e4m3's range (NaN stays NaN), as fp8."""
    q = tl.clamp(tl.div_rn(x, scale), -_MAX, _MAX, propagate_nan=tl.PropagateNan.ALL)
    if ROUND_FP8:  # the interpreter's fp8 cast truncates: round first, then the cast is exact
        q = _round_to_e4m3(q)
    return q.to(tl.float8e4nv)


@triton.jit
def _fp8_quant_kernel(
    x_ptr,  # (M, HIDDEN) fp32 / fp16 / bf16, unit column stride
    out_ptr,  # (M, HIDDEN) float8_e4m3fn, contiguous
    scale_ptr,  # (M, 1) fp32, contiguous: each row's scale, written
    static_scale_ptr,  # (1,) fp32: read when STATIC
    stride_x,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    STATIC: tl.constexpr,
    ROUND_FP8: tl.constexpr,
):
    """One program per row."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * HIDDEN
    cols = tl.arange(0, BLOCK)
    if STATIC:
        scale = tl.load(static_scale_ptr)
    if HIDDEN <= BLOCK:  # the whole row in registers, read once
        x = tl.load(x_row + cols, mask=cols < HIDDEN, other=0.0).to(tl.float32)
        if not STATIC:
            scale = tl.maximum(tl.max(tl.abs(x), axis=0) * _INV_MAX, _MIN_SCALE)
        tl.store(out_row + cols, _quantize_tile(x, scale, ROUND_FP8), mask=cols < HIDDEN)
    else:  # a first pass for the amax, a second one to quantize
        if not STATIC:
            amax = tl.zeros((), tl.float32)
            for start in range(0, HIDDEN, BLOCK):
                x = tl.load(x_row + start + cols, mask=start + cols < HIDDEN, other=0.0).to(tl.float32)
                amax = tl.maximum(amax, tl.max(tl.abs(x), axis=0))
            scale = tl.maximum(amax * _INV_MAX, _MIN_SCALE)
        for start in range(0, HIDDEN, BLOCK):
            mask = start + cols < HIDDEN
            x = tl.load(x_row + start + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_row + start + cols, _quantize_tile(x, scale, ROUND_FP8), mask=mask)
    tl.store(scale_ptr + row, scale)


def launch_config(hidden: int, static: bool, round_fp8: bool, max_block: int = MAX_BLOCK) -> tuple[dict, int]:
    """The kernel's compile-time arguments and warps for rows of ``hidden`` features: a
    tile of up to ``max_block`` columns, about 32 of them per thread (also read by
    ``tools/kernel_report.py``)."""
    block = min(triton.next_power_of_2(hidden), max_block)
    num_warps = max(1, min(16, block // 1024))
    return dict(HIDDEN=hidden, BLOCK=block, STATIC=static, ROUND_FP8=round_fp8), num_warps


def check_fp8_quant_capability(capability: tuple[int, int]) -> None:
    """Refuse a GPU of compute ``capability`` where Triton has no float8_e4m3fn."""
    check_fp8_capability(
        capability,
        "fp8 activation quantization needs",
        "below it fp8 linears dequantize their weights instead (the fp8 GEMM is not used)",
    )


def quantize_fp8_rows(
    x: torch.Tensor,  # (M, K), unit column stride
    input_scale: torch.Tensor | None = None,  # (1,) fp32: static; None: a scale per row
    max_block: int = MAX_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` as ``torch._scaled_mm`` wants it: (M, K) float8_e4m3fn, contiguous, and the
    (M, 1) fp32 scale of each row (module docstring). ``max_block`` (a power of two)
    only changes how a row is tiled, never the result."""
    device = x.device
    check_launchable(device, _fp8_quant_kernel)
    if device.type == "cuda":
        check_fp8_quant_capability(torch.cuda.get_device_capability(device))
    check_tensor(x, "x", device, dims=2)
    require(x.dtype in SUPPORTED_DTYPES, f"x dtype must be one of {SUPPORTED_DTYPES}, got {x.dtype}")
    if input_scale is not None:
        check_tensor(input_scale, "input_scale", device, dims=1)
        require(
            input_scale.shape == (1,) and input_scale.dtype == torch.float32,
            f"input_scale must be (1,) fp32, got {tuple(input_scale.shape)} {input_scale.dtype}",
        )
    require(
        max_block >= 16 and max_block & (max_block - 1) == 0, f"max_block must be a power of two >= 16, got {max_block}"
    )
    m, hidden = x.shape
    require(hidden > 0, f"x must have at least one column, got shape {tuple(x.shape)}")
    out = torch.empty(m, hidden, dtype=FP8, device=device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=device)
    if m == 0:
        return out, scale
    constexprs, num_warps = launch_config(hidden, input_scale is not None, is_interpreted(_fp8_quant_kernel), max_block)
    _fp8_quant_kernel[(m,)](
        x,
        out,
        scale,
        input_scale if input_scale is not None else scale,
        x.stride(0),
        **constexprs,
        num_warps=num_warps,
    )
    return out, scale
