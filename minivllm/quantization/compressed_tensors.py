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

from minivllm.quantization.base import LinearMethod, QuantizationConfig
from minivllm.quantization.fp8 import Fp8LinearMethod, ScaledWeightMethod
from minivllm.quantization.ignore import is_ignored
from minivllm.quantization.packed_int import PackedInt4Method, PackedInt8Method

FORMATS = ("float-quantized", "int-quantized", "naive-quantized", "pack-quantized")
STRATEGIES = ("tensor", "channel")
PACKED_GROUP_SIZES = (32, 64, 128)


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
        fmt = config.get("format")
        if fmt not in FORMATS:
            raise ValueError(f"compressed-tensors format={fmt!r} is not supported; supported: {list(FORMATS)}")
        groups = list((config.get("config_groups") or {}).values())
        if len(groups) != 1:
            raise ValueError(f"compressed-tensors: exactly one entry in config_groups is supported, got {len(groups)}")
        group = groups[0]
        if "Linear" not in (group.get("targets") or []):
            raise ValueError(
                f"compressed-tensors config_groups targets={group.get('targets')}: only ['Linear'] is supported"
            )
        weights, acts = group.get("weights") or {}, group.get("input_activations")
        ignore = list(config.get("ignore") or [])
        if fmt == "pack-quantized":
            group_size = weights.get("group_size") if weights.get("strategy") == "group" else None
            return cls(_packed_scheme(weights, acts), False, ignore, group_size)
        scheme, static = _scheme(weights, acts)
        return cls(scheme, static, ignore)

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


def _scheme(weights: dict[str, Any], acts: dict[str, Any] | None) -> tuple[str, bool]:
    """(scheme, static input scale) for the supported weight / activation argument pairs."""
    kind, bits, strategy = weights.get("type"), weights.get("num_bits"), weights.get("strategy")
    if bits != 8 or strategy not in STRATEGIES or not weights.get("symmetric", True):
        raise ValueError(
            f"compressed-tensors weights {{type: {kind}, num_bits: {bits}, strategy: {strategy}}}: supported are "
            f"symmetric 8-bit float (W8A8-FP8) or int (W8A16) with strategy in {list(STRATEGIES)}"
        )
    if kind == "float":
        if not acts or acts.get("type") != "float" or acts.get("num_bits") != 8:
            raise ValueError("compressed-tensors fp8 weights need fp8 input_activations (the W8A8-FP8 scheme)")
        dynamic = bool(acts.get("dynamic", False))
        allowed = ("tensor", "token") if dynamic else ("tensor",)
        if acts.get("strategy") not in allowed:
            raise ValueError(f"compressed-tensors input_activations strategy={acts.get('strategy')!r} with "
                             f"dynamic={dynamic}: allowed {list(allowed)}")
        return "fp8", not dynamic
    if kind == "int" and acts is None:
        return "int8-w8a16", False
    raise ValueError(f"compressed-tensors: weights of type {kind!r} with input_activations {acts}: supported are "
                     f"W8A8-FP8 and int8 W8A16")


def _packed_scheme(weights: dict[str, Any], acts: dict[str, Any] | None) -> str:
    """pack-quantized: symmetric int4 (per group or channel) or int8 (per channel), weight-only."""
    bits, strategy, group = weights.get("num_bits"), weights.get("strategy"), weights.get("group_size")
    ok_group = strategy == "channel" or (strategy == "group" and group in PACKED_GROUP_SIZES and bits == 4)
    if weights.get("type") != "int" or bits not in (4, 8) or not ok_group or not weights.get("symmetric", True) or acts:
        raise ValueError(
            f"compressed-tensors pack-quantized weights {{num_bits: {bits}, strategy: {strategy}, group_size: {group}}}"
            f" with input_activations {acts}: supported are symmetric int4 per channel or per group "
            f"{list(PACKED_GROUP_SIZES)}, and int8 per channel, weight-only"
        )
    return "int4-packed" if bits == 4 else "int8-packed"
