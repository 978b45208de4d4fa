"""AWQ (AutoAWQ "gemm" layout): 4-bit weights packed along the output features.

Checkpoint tensors of a linear layer with K inputs, N outputs, group size g:

    qweight (K, N // 8) int32    eight output columns per int32, in AWQ's
                                 interleaved order: nibble i holds column 8c + AWQ_ORDER[i]
    qzeros  (K // g, N // 8)     zero points, packed the same way
    scales  (K // g, N) fp16

Real weight ``W[k, n] = (q[k, n] - z[k // g, n]) * s[k // g, n]`` with ``y = x @ W``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minivllm.config.model import awq_settings
from minivllm.quantization.base import LinearShape, ParamSpec, QuantizationConfig, add_param, is_ignored
from minivllm.quantization.int4 import PACK, Int4LinearMethod, pack_rows, unpack_cols

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


class AWQConfig(QuantizationConfig):
    """config.json: ``{"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"}``."""

    name = "awq"

    def __init__(self, group_size: int, modules_to_not_convert: list[str]) -> None:
        self.group_size = group_size
        self.modules_to_not_convert = modules_to_not_convert

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "AWQConfig":
        return cls(**awq_settings(config))

    def get_linear_method(self, prefix: str, members: list[str]) -> "AWQLinearMethod | None":
        if is_ignored(prefix, members, self.modules_to_not_convert):
            return None
        return AWQLinearMethod(self.group_size)


class AWQLinearMethod(Int4LinearMethod):
    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def create_weights(self, layer: nn.Module, shape: LinearShape, params_dtype: torch.dtype) -> None:
        k, n, g = shape.input_size_per_partition, shape.output_size_per_partition, self.group_size
        if k % g or any(size % PACK for size in shape.output_sizes):
            raise ValueError(
                f"awq: a layer with {k} input features (per rank) and outputs {list(shape.output_sizes)} "
                f"does not fit group size {g} and packs of {PACK} outputs"
            )
        packed = ParamSpec(out_dim=1, in_dim=0, out_pack=PACK)
        add_param(layer, "qweight", (k, n // PACK), torch.int32, packed)
        add_param(layer, "qzeros", (k // g, n // PACK), torch.int32, packed)
        add_param(layer, "scales", (k // g, n), params_dtype, ParamSpec(out_dim=1, in_dim=0))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        k = layer.qweight.shape[0]
        q = unpack_cols(layer.qweight.data, AWQ_ORDER)  # (K, N)
        zeros = unpack_cols(layer.qzeros.data, AWQ_ORDER)  # (G, N)
        g_idx = torch.arange(k, device=q.device) // self.group_size
        self.finish(layer, pack_rows(q), layer.scales.data, zeros, g_idx)
