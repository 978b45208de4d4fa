"""fp8 (e4m3) weights with per-tensor or per-output-channel scales: vLLM's ``fp8`` format.

A checkpoint stores ``weight`` as float8_e4m3fn (out, in), ``weight_scale`` (a
scalar per checkpoint tensor, or one per output channel) and, with static
activation scales, ``input_scale`` (a scalar). Real weight = fp8 value * scale.

Per-tensor scales of fused members (q, k, v) differ, so ``weight_scale`` is kept
per output channel: a member's scalar fills its rows. Static input scales of the
members act on the same input, so after loading the largest one is kept.

``model.quantization=fp8`` on an unquantized checkpoint quantizes each weight
while loading (one scale per output channel), as vLLM does for ``quantization="fp8"``.

On a GPU with fp8 tensor cores (compute capability 8.9+) the matmul is
``torch._scaled_mm`` on fp8 activations (quantized per token, or with the static
scale, by one Triton kernel: ``triton_fp8_quant.py``, which also holds its torch
reference ``quantize_activations``), row-wise scaled: bf16 activations. fp16 and fp32
activations, which its row-wise path does not take, go through the Triton fp8 GEMM
(``triton_fp8_gemm.py``) on the same fp8 operands. Both read the weight as loaded: (out,
in) row-major, so ``weight.t()`` is the column-major (in, out) operand ``_scaled_mm``
wants, with no copy. Elsewhere, the CPU included, the weight is dequantized to the
activation dtype and multiplied there (the reference path).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.config.model import fp8_settings
from minivllm.quantization.base import (
    LinearMethod,
    LinearShape,
    ParamSpec,
    QuantizationConfig,
    add_param,
    is_ignored,
    replace_param,
)
from minivllm.tuned_tiles import has_fp8

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448


class Fp8Config(QuantizationConfig):
    """config.json: ``{"quant_method": "fp8", "activation_scheme": "static"|"dynamic", "ignored_layers": [...]}``."""

    name = "fp8"

    def __init__(self, activation_scheme: str, ignored_layers: list[str], serialized: bool = True) -> None:
        self.activation_scheme = activation_scheme
        self.ignored_layers = ignored_layers
        self.serialized = serialized

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Fp8Config":
        return cls(**fp8_settings(config))

    def get_linear_method(self, prefix: str, members: list[str]) -> LinearMethod | None:
        if is_ignored(prefix, members, self.ignored_layers):
            return None
        if not self.serialized:
            return Fp8OnlineMethod()
        return Fp8LinearMethod(static_input=self.activation_scheme == "static")


class ScaledWeightMethod(LinearMethod):
    """A (out, in) weight of a narrow dtype times a per-output-channel float32 scale."""

    weight_dtype: torch.dtype = FP8

    def __init__(self, static_input: bool = False) -> None:
        self.static_input = static_input

    def create_weights(self, layer: nn.Module, shape: LinearShape, params_dtype: torch.dtype) -> None:
        out, inp = shape.output_size_per_partition, shape.input_size_per_partition
        add_param(layer, "weight", (out, inp), self.weight_dtype, ParamSpec(out_dim=0, in_dim=1))
        add_param(layer, "weight_scale", (out,), torch.float32, ParamSpec(out_dim=0, broadcast=True))
        if self.static_input:
            add_param(layer, "input_scale", (len(shape.output_sizes),), torch.float32, ParamSpec(per_member=True))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if self.static_input:
            replace_param(layer, "input_scale", layer.input_scale.max().reshape(1))

    def dequantize(self, layer: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The real weight, (out, in) in ``dtype``."""
        return (layer.weight.to(torch.float32) * layer.weight_scale[:, None]).to(dtype)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, self.dequantize(layer, x.dtype), bias)


class Fp8LinearMethod(ScaledWeightMethod):
    """fp8 weights; ``torch._scaled_mm`` where the GPU has fp8 tensor cores."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if _scaled_mm_usable(x, layer.weight) or _triton_fp8_usable(x):
            return _fp8_matmul(x, layer, bias, gemm=_pick_gemm)
        return F.linear(x, self.dequantize(layer, x.dtype), bias)


class Fp8OnlineMethod(Fp8LinearMethod):
    """Loads the model-dtype weight, then keeps it as fp8 with one scale per output row
    (amax / 448); activations are scaled per token (dynamic)."""

    def create_weights(self, layer: nn.Module, shape: LinearShape, params_dtype: torch.dtype) -> None:
        out, inp = shape.output_size_per_partition, shape.input_size_per_partition
        add_param(layer, "weight", (out, inp), params_dtype, ParamSpec(out_dim=0, in_dim=1))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight = layer.weight.data.to(torch.float32)  # (out, in)
        scale = (weight.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
        replace_param(layer, "weight", (weight / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8))
        replace_param(layer, "weight_scale", scale.reshape(-1))


def _scaled_mm_usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Row-wise scaled fp8 GEMM: sm89+, bf16 output, both matrix dims multiples of 16."""
    if x.device.type != "cuda" or x.dtype != torch.bfloat16:
        return False
    out, inp = weight.shape
    return has_fp8(torch.cuda.get_device_capability(x.device)) and out % 16 == 0 and inp % 16 == 0


def _triton_fp8_usable(x: torch.Tensor) -> bool:
    """The Triton fp8 GEMM: sm89+, activations _scaled_mm's row-wise path does not take."""
    return (
        x.device.type == "cuda"
        and x.dtype in (torch.float16, torch.float32)
        and has_fp8(torch.cuda.get_device_capability(x.device))
    )


ActivationQuantizer = Callable[[torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]
"""(tokens, in) activations and the static input scale or None -> fp8 values and (tokens, 1) scales."""


def _fused_quantize(x2: torch.Tensor, input_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel (imported on first use: the CPU path never needs Triton)."""
    from minivllm.quantization.triton_fp8_quant import quantize_fp8_rows

    return quantize_fp8_rows(x2 if x2.stride(-1) == 1 else x2.contiguous(), input_scale)


def _scaled_mm_gemm(x_fp8, x_scale, layer: nn.Module, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """Row-wise scaled ``torch._scaled_mm``: (tokens, in) fp8 @ the column-major view of the weight."""
    w_scale = layer.weight_scale.reshape(1, -1)  # (1, out)
    return torch._scaled_mm(x_fp8, layer.weight.t(), scale_a=x_scale, scale_b=w_scale, bias=bias, out_dtype=out_dtype)


def _triton_gemm(x_fp8, x_scale, layer: nn.Module, bias, out_dtype: torch.dtype, tiles=None) -> torch.Tensor:
    """The Triton fp8 GEMM (imported on first use) on the same operands."""
    from minivllm.quantization.triton_fp8_gemm import fp8_gemm

    return fp8_gemm(x_fp8, x_scale, layer.weight, layer.weight_scale, out_dtype, bias, tiles)


def _pick_gemm(x_fp8, x_scale, layer: nn.Module, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """``_scaled_mm`` or the Triton GEMM, as ``triton_fp8_gemm.choose_gemm`` says for this
    device, weight and token count (bf16 without a tuned entry: ``_scaled_mm``)."""
    from minivllm.quantization.triton_fp8_gemm import choose_gemm
    from minivllm.tuned_tiles import device_facts

    (m, k), n = x_fp8.shape, layer.weight.shape[0]
    tiles = choose_gemm(m, n, k, str(out_dtype).removeprefix("torch."), device_facts(x_fp8.device))
    if tiles is None:
        return _scaled_mm_gemm(x_fp8, x_scale, layer, bias, out_dtype)
    return _triton_gemm(x_fp8, x_scale, layer, bias, out_dtype, tiles)


def _fp8_matmul(
    x: torch.Tensor,
    layer: nn.Module,
    bias: torch.Tensor | None,
    quantize: ActivationQuantizer = _fused_quantize,
    gemm: Callable[..., torch.Tensor] = _scaled_mm_gemm,
) -> torch.Tensor:
    """``gemm`` (``torch._scaled_mm``, or the Triton fp8 GEMM) on ``x`` quantized by ``quantize``
    (the Triton kernel; its torch reference ``triton_fp8_quant.quantize_activations`` where a
    test or benchmark passes it)."""
    x2 = x.reshape(-1, x.shape[-1])  # (tokens, in)
    x_fp8, x_scale = quantize(x2, getattr(layer, "input_scale", None))  # (tokens, in), (tokens, 1)
    y = gemm(x_fp8, x_scale, layer, bias, x.dtype)  # (tokens, out)
    return y.reshape(*x.shape[:-1], -1)
