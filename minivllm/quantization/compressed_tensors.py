"""``compressed-tensors`` checkpoints (llm-compressor): W8A8-FP8, int8 W8A16, and packed W4A16 / W8A16.

The scheme is read from ``config_groups``: each group names its ``targets``
(``Linear``) and the ``weights`` / ``input_activations`` quantization args.
Tensors are ``weight`` (fp8 or int8, (out, in)), ``weight_scale`` ((out, 1) per
channel or (1,) per tensor) and, for static fp8 activations, ``input_scale``.
Layers named in ``ignore`` stay unquantized.

The ``pack-quantized`` format: symmetric intN packed along the input. Per linear
layer: ``weight_packed`` (out, in * N / 32) int32, values stored with an offset
(q + 2^(N-1)) in consecutive N-bit fields, lowest bits first; ``weight_scale``
(out, groups) (one group: per channel); ``weight_shape`` (2,), the unpacked (out, in).
Real weight = q * scale. 4-bit weights become the int4 layout of ``int4.py`` (zero
point 8, so the offset cancels); 8-bit per-channel weights become a plain int8 weight.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minivllm.config.model import compressed_tensors_settings
from minivllm.quantization.base import (
    LinearMethod,
    LinearShape,
    ParamSpec,
    QuantizationConfig,
    add_param,
    is_ignored,
    replace_param,
)
from minivllm.quantization.fp8 import Fp8LinearMethod, ScaledWeightMethod
from minivllm.quantization.int4 import Int4LinearMethod, pack_rows, unpack_cols


class Int8WeightOnlyMethod(ScaledWeightMethod):
    """W8A16: symmetric int8 weights, per-channel or per-tensor scales, activations untouched."""

    weight_dtype = torch.int8


def _add_packed(layer: nn.Module, shape: LinearShape, bits: int) -> None:
    per_word = 32 // bits
    k, n = shape.input_size_per_partition, shape.output_size_per_partition
    if k % per_word:
        raise ValueError(
            f"compressed-tensors: {k} input features (per rank) do not fill {bits}-bit packs of {per_word}"
        )
    add_param(layer, "weight_packed", (n, k // per_word), torch.int32, ParamSpec(out_dim=0, in_dim=1))
    add_param(layer, "weight_shape", (len(shape.output_sizes), 2), torch.int64, ParamSpec(per_member=True))


class PackedInt4Method(Int4LinearMethod):
    """W4A16: ``group_size`` None means one scale per output channel."""

    def __init__(self, group_size: int | None) -> None:
        self.group_size = group_size

    def create_weights(self, layer: nn.Module, shape: LinearShape, params_dtype: torch.dtype) -> None:
        _add_packed(layer, shape, 4)
        k, n = shape.input_size_per_partition, shape.output_size_per_partition
        if self.group_size is None:  # per channel: every rank keeps the one group
            add_param(layer, "weight_scale", (n, 1), params_dtype, ParamSpec(out_dim=0))
        elif k % self.group_size:
            raise ValueError(
                f"compressed-tensors: {k} input features (per rank) do not fit group size {self.group_size}"
            )
        else:
            add_param(layer, "weight_scale", (n, k // self.group_size), params_dtype, ParamSpec(out_dim=0, in_dim=1))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        q = unpack_cols(layer.weight_packed.data).t()  # (K, N), offset by 8
        scales = layer.weight_scale.data.t()  # (G, N)
        group = q.shape[0] // scales.shape[0]
        g_idx = torch.arange(q.shape[0], device=q.device) // group
        zeros = torch.full(scales.shape, 8, dtype=torch.uint8, device=q.device)
        self.finish(layer, pack_rows(q), scales, zeros, g_idx)


class PackedInt8Method(ScaledWeightMethod):
    """W8A16 per channel, packed four to an int32: unpacked into an int8 weight after loading."""

    weight_dtype = torch.int8

    def create_weights(self, layer: nn.Module, shape: LinearShape, params_dtype: torch.dtype) -> None:
        _add_packed(layer, shape, 8)
        add_param(
            layer,
            "weight_scale",
            (shape.output_size_per_partition,),
            torch.float32,
            ParamSpec(out_dim=0, broadcast=True),
        )

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        packed = layer.weight_packed.data  # (N, K / 4)
        shifts = torch.arange(0, 32, 8, dtype=torch.int32, device=packed.device)
        fields = (packed[:, :, None] >> shifts) & 0xFF  # (N, K / 4, 4)
        weight = (fields.reshape(packed.shape[0], -1) - 128).to(torch.int8)
        delattr(layer, "weight_packed")
        delattr(layer, "weight_shape")
        layer.param_specs = {}
        replace_param(layer, "weight", weight)


class CompressedTensorsConfig(QuantizationConfig):
    name = "compressed-tensors"

    def __init__(self, scheme: str, static_input: bool, ignore: list[str], group_size: int | None = None) -> None:
        self.scheme = scheme  # "fp8" (W8A8-FP8), "int8-w8a16", or packed: "int4-packed", "int8-packed"
        self.static_input = static_input
        self.ignore = ignore
        self.group_size = group_size

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "CompressedTensorsConfig":
        return cls(**compressed_tensors_settings(config))

    def get_linear_method(self, prefix: str, members: list[str]) -> LinearMethod | None:
        if is_ignored(prefix, members, self.ignore):
            return None
        if self.scheme == "fp8":
            return Fp8LinearMethod(static_input=self.static_input)
        if self.scheme == "int4-packed":
            return PackedInt4Method(self.group_size)
        if self.scheme == "int8-packed":
            return PackedInt8Method()
        return Int8WeightOnlyMethod()
