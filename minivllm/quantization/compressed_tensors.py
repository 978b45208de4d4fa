"""``compressed-tensors`` checkpoints (llm-compressor): W8A8-FP8, int8 W8A16, and packed W4A16 / W8A16.

The scheme is read from ``config_groups``: each group names its ``targets``
(``Linear``) and the ``weights`` / ``input_activations`` quantization args.
Tensors are ``weight`` (fp8 or int8, (out, in)), ``weight_scale`` ((out, 1) per
channel or (1,) per tensor) and, for static fp8 activations, ``input_scale``.
The ``pack-quantized`` format packs int4 / int8 weights into int32
(``packed_int.py``). Layers named in ``ignore`` stay unquantized.
"""

from __future__ import annotations

from typing import Any

import torch

from minivllm.config.model import compressed_tensors_settings
from minivllm.quantization.base import LinearMethod, QuantizationConfig
from minivllm.quantization.fp8 import Fp8LinearMethod, ScaledWeightMethod
from minivllm.quantization.ignore import is_ignored
from minivllm.quantization.packed_int import PackedInt4Method, PackedInt8Method


class Int8WeightOnlyMethod(ScaledWeightMethod):
    """W8A16: symmetric int8 weights, per-channel or per-tensor scales, activations untouched."""

    weight_dtype = torch.int8


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
