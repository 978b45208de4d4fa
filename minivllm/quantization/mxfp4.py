"""MXFP4 expert weights: gpt-oss's released format (``quantization_config.quant_method == "mxfp4"``).

Only the MoE experts are quantized; attention, router, embeddings and the LM head are in
the model dtype. Each expert matrix, in (out, in) layout, is stored as two tensors::

    <name>_blocks  (E, out, in / 32, 16) uint8   two fp4 (e2m1) codes a byte, low nibble first
    <name>_scales  (E, out, in / 32)     uint8   one power of two per 32 values: 2 ** (scale - 127)

A code's value is ``FP4_VALUES[code]``; element ``j`` of a row is
``FP4_VALUES[nibble j] * 2 ** (scale[j // 32] - 127)``.

The weights are dequantized once, while loading, to the model dtype (``dequantize_mxfp4``:
torch on the CPU, one Triton kernel on CUDA, ``_dequant_mxfp4_kernel``); the experts then run
as unquantized ones (no fp4 matmul here). ``Mxfp4Config`` hands no linear layer a method: the
gpt-oss model reads the blocks and scales itself.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from minivllm.quantization.base import LinearMethod, QuantizationConfig

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The e2m1 value of each 4-bit code."""
BLOCK_VALUES = 32
"""Values sharing one scale (16 bytes of blocks)."""


class Mxfp4Config(QuantizationConfig):
    """config.json: ``{"quant_method": "mxfp4", "modules_to_not_convert": [...]}``. The experts'
    blocks and scales are the model's to load; every linear layer stays unquantized."""

    name = "mxfp4"

    def __init__(self, modules_to_not_convert: list[str] | None = None) -> None:
        self.modules_to_not_convert = list(modules_to_not_convert or [])

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Mxfp4Config":
        return cls(config.get("modules_to_not_convert"))

    def get_linear_method(self, prefix: str, members: list[str]) -> LinearMethod | None:
        return None


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(..., R, G, 16) uint8 blocks and (..., R, G) uint8 scales -> (..., R, G * 32) ``dtype``,
    on the tensors' device (the Triton kernel on CUDA, torch elsewhere)."""
    if tuple(blocks.shape[:-1]) != tuple(scales.shape) or blocks.shape[-1] != BLOCK_VALUES // 2:
        raise ValueError(
            f"mxfp4: blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not pair "
            f"(expected blocks = scales' shape + (16,))"
        )
    if blocks.is_cuda:
        return triton_dequantize_mxfp4(blocks, scales, dtype)
    return torch_dequantize_mxfp4(blocks, scales, dtype)


def torch_dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The reference: look the codes up, then scale by the power of two (exact in fp32)."""
    *prefix, groups, _ = blocks.shape
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    blocks = blocks.to(torch.uint8)
    codes = torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).long()  # (..., G, 16, 2): low nibble first
    values = lut[codes].view(*prefix, groups, BLOCK_VALUES)  # (..., G, 32)
    exponents = scales.to(torch.int32) - 127  # (..., G)
    out = torch.ldexp(values, exponents.unsqueeze(-1).to(torch.float32))
    return out.view(*prefix, groups * BLOCK_VALUES).to(dtype)


def triton_dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``torch_dequantize_mxfp4`` in one launch: one program per ``ROWS`` groups of 32 values."""
    *prefix, groups, _ = blocks.shape
    blocks, scales = blocks.contiguous(), scales.contiguous()
    num_groups = scales.numel()
    out = torch.empty(*prefix, groups * BLOCK_VALUES, dtype=dtype, device=blocks.device)
    rows = 64
    if num_groups:
        _dequant_mxfp4_kernel[(triton.cdiv(num_groups, rows),)](blocks, scales, out, num_groups, ROWS=rows)
    return out


@triton.jit
def _dequant_mxfp4_kernel(
    blocks_ptr,  # (N, 16) uint8: N groups of 32 fp4 codes
    scales_ptr,  # (N,) uint8
    out_ptr,  # (N, 32)
    num_groups,
    ROWS: tl.constexpr,
):
    group = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # (ROWS,)
    ok = group < num_groups
    j = tl.arange(0, 32)  # value j of a group is nibble j % 2 of byte j // 2
    packed = tl.load(blocks_ptr + group[:, None] * 16 + (j // 2)[None, :], mask=ok[:, None], other=0)
    code = ((packed.to(tl.int32) >> ((j % 2) * 4)[None, :]) & 0x0F).to(tl.int32)  # (ROWS, 32)
    # e2m1: sign bit 3, exponent bits 1-2, mantissa bit 0; exponent 0 is subnormal (0 or 0.5).
    exp_bits = (code >> 1) & 3
    mantissa = (code & 1).to(tl.float32)
    magnitude = tl.where(exp_bits == 0, 0.5 * mantissa, (1.0 + 0.5 * mantissa) * tl.exp2((exp_bits - 1).to(tl.float32)))
    value = tl.where(code >= 8, -magnitude, magnitude)
    scale = tl.load(scales_ptr + group, mask=ok, other=127).to(tl.int32) - 127
    value = value * tl.exp2(scale.to(tl.float32))[:, None]
    tl.store(out_ptr + group[:, None] * 32 + j[None, :], value.to(out_ptr.dtype.element_ty), mask=ok[:, None])


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., R, C) float, C a multiple of 32 -> (blocks (..., R, C/32, 16), scales (..., R, C/32)) uint8:
    each group's scale is the power of two that brings its largest magnitude to at most 6, each value
    the nearest code. For tests and tools that write MXFP4 checkpoints."""
    *prefix, cols = weight.shape
    if cols % BLOCK_VALUES:
        raise ValueError(f"mxfp4: the last dim {cols} must be a multiple of {BLOCK_VALUES}")
    groups = weight.float().reshape(*prefix, cols // BLOCK_VALUES, BLOCK_VALUES)
    amax = groups.abs().amax(-1).clamp_min(2.0**-126)  # (..., G)
    exponent = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent).unsqueeze(-1)
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    codes = (scaled.unsqueeze(-1) - lut).abs().argmin(-1).to(torch.uint8)  # (..., G, 32)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.contiguous(), (exponent + 127).to(torch.uint8)
