"""GPTQ (AutoGPTQ / GPTQModel): 4-bit weights packed along the input features.

Checkpoint tensors of a linear layer with K inputs, N outputs, group size g
(G = K // g groups, or one group when g = -1):

    qweight (K // 8, N) int32   eight consecutive input rows per int32
    qzeros  (G, N // 8) int32   zero points packed along the outputs; format v1
                                ("gptq") stores zero - 1, v2 ("gptq_v2") the zero
    scales  (G, N) fp16
    g_idx   (K,) int32          group of each input row (a permutation with desc_act)

Real weight ``W[k, n] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]`` with ``y = x @ W``.
With desc_act the groups are scattered over the input rows, so a row-parallel
rank keeps every group's scales and zeros (its rows may use any of them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minivllm.config.model import gptq_settings
from minivllm.quantization.base import LinearShape, ParamSpec, QuantizationConfig, add_param, is_ignored
from minivllm.quantization.int4 import PACK, Int4LinearMethod, unpack_cols


class GPTQConfig(QuantizationConfig):
    """config.json: ``{"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false}``."""

    name = "gptq"

    def __init__(self, group_size: int, desc_act: bool, zero_offset: int, skip: list[str]) -> None:
        self.group_size = group_size
        self.desc_act = desc_act
        self.zero_offset = zero_offset
        self.skip = skip

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "GPTQConfig":
        return cls(**gptq_settings(config))

    def get_linear_method(self, prefix: str, members: list[str]) -> "GPTQLinearMethod | None":
        if is_ignored(prefix, members, self.skip):
            return None
        return GPTQLinearMethod(self)


class GPTQLinearMethod(Int4LinearMethod):
    def __init__(self, config: GPTQConfig) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, shape: LinearShape, params_dtype: torch.dtype) -> None:
        k, n = shape.input_size_per_partition, shape.output_size_per_partition
        group = shape.input_size if self.config.group_size == -1 else self.config.group_size
        all_groups = shape.input_is_sharded and (self.config.desc_act or self.config.group_size == -1)
        if k % PACK or (not all_groups and k % group) or any(size % PACK for size in shape.output_sizes):
            raise ValueError(
                f"gptq: a layer with {k} input features (per rank) and outputs {list(shape.output_sizes)} "
                f"does not fit group size {group} and packs of {PACK}"
            )
        num_groups = shape.input_size // group if all_groups else k // group
        group_dim = None if all_groups else 0
        self.group = group
        add_param(layer, "qweight", (k // PACK, n), torch.int32, ParamSpec(out_dim=1, in_dim=0))
        add_param(
            layer, "qzeros", (num_groups, n // PACK), torch.int32, ParamSpec(out_dim=1, in_dim=group_dim, out_pack=PACK)
        )
        add_param(layer, "scales", (num_groups, n), params_dtype, ParamSpec(out_dim=1, in_dim=group_dim))
        add_param(layer, "g_idx", (k,), torch.int32, ParamSpec(in_dim=0))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        zeros = unpack_cols(layer.qzeros.data) + self.config.zero_offset  # (G, N)
        if self.config.desc_act:
            g_idx = layer.g_idx.data
            if g_idx.numel() and (int(g_idx.min()) < 0 or int(g_idx.max()) >= zeros.shape[0]):
                raise ValueError(f"gptq: g_idx holds groups outside 0..{zeros.shape[0] - 1}")
        else:  # groups in input order; the checkpoint's g_idx says the same
            g_idx = torch.arange(layer.g_idx.shape[0], device=zeros.device) // self.group
        self.finish(layer, layer.qweight.data, layer.scales.data, zeros, g_idx)
