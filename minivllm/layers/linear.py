"""Linear layers that know how to shard themselves over tensor-parallel ranks.

Column-parallel layers split the output features (each rank computes a slice
of the outputs); row-parallel layers split the input features and all-reduce
the partial sums. A column-parallel layer feeding a row-parallel one needs no
communication in between, which is why attention is qkv(column) -> o(row) and
the MLP is gate_up(column) -> down(row).

Every layer has a ``weight_loader(param, loaded, shard_id=None)`` that takes
the full checkpoint tensor (or a lazy safetensors slice) for one of its
parameters and copies this rank's part into place; fused layers (qkv, gate_up)
take ``shard_id`` to say which checkpoint tensor is arriving. (It is a method of
the layer, not an attribute of the parameter: parameters are replaced when a
model built on the meta device is materialised.)
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed.parallel_state import all_reduce, tp_rank, tp_size
from minivllm.layers.weight_utils import as_tensor, copy_checked, loaded_shape, narrow


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what}={numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator


class ReplicatedLinear(nn.Module):
    """Every rank holds the whole layer; the base of the sharded layers below."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        copy_checked(param, as_tensor(loaded))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ColumnParallelLinear(ReplicatedLinear):
    """Output features split over ranks; the output stays split (no gather)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        super().__init__(in_features, divide(out_features, self.tp_size, "output features"), bias)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        size = param.shape[0]
        copy_checked(param, narrow(loaded, 0, self.tp_rank * size, size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel layers fused into one matmul (e.g. gate and up).

    The local weight is ``[gate_shard; up_shard]``: each rank keeps its slice of
    every member, not a slice of the concatenation.
    """

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = True) -> None:
        self.out_sizes = out_sizes
        super().__init__(in_features, sum(out_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        if shard_id is None:  # the checkpoint already holds the fused tensor (e.g. Phi-3)
            for i, part in enumerate(_split_rows(as_tensor(loaded), self.out_sizes)):
                self.weight_loader(param, part, i)
            return
        size = self.out_sizes[shard_id] // self.tp_size
        offset = sum(self.out_sizes[:shard_id]) // self.tp_size
        copy_checked(param.data.narrow(0, offset, size), narrow(loaded, 0, self.tp_rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q, k, v projections, split by attention heads.

    With more ranks than KV heads, each KV head is replicated on
    ``tp_size // num_kv_heads`` ranks.
    """

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = True):
        world = tp_size()
        self.head_dim = head_dim
        self.num_heads = divide(num_heads, world, "attention heads")
        if num_kv_heads >= world:
            self.num_kv_heads = divide(num_kv_heads, world, "KV heads")
            self.kv_replicas = 1
        else:
            self.num_kv_heads = 1
            self.kv_replicas = divide(world, num_kv_heads, "tensor-parallel size over KV heads")
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * world
        super().__init__(hidden_size, out, bias)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        if shard_id is None:  # fused qkv in the checkpoint: split it into its members first
            full_q = self.q_size * self.tp_size
            full_kv = (loaded_shape(loaded)[0] - full_q) // 2
            for sid, part in zip("qkv", _split_rows(as_tensor(loaded), [full_q, full_kv, full_kv])):
                self.weight_loader(param, part, sid)
            return
        if shard_id == "q":
            offset, size, rank_start = 0, self.q_size, self.tp_rank * self.q_size
        else:
            kv_rank = self.tp_rank // self.kv_replicas
            offset = self.q_size + (0 if shard_id == "k" else self.kv_size)
            size, rank_start = self.kv_size, kv_rank * self.kv_size
        copy_checked(param.data.narrow(0, offset, size), narrow(loaded, 0, rank_start, size))


class RowParallelLinear(ReplicatedLinear):
    """Input features split over ranks; partial outputs are summed across ranks."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        super().__init__(divide(in_features, self.tp_size, "input features"), out_features, bias)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        if param.dim() == 1:  # the bias is added once, after the reduction
            copy_checked(param, as_tensor(loaded))
            return
        size = param.shape[1]
        copy_checked(param, narrow(loaded, 1, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.tp_size > 1:
            y = all_reduce(y)
        return y if self.bias is None else y + self.bias


def _split_rows(tensor: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    if tensor.shape[0] != sum(sizes):
        raise ValueError(f"fused weight has {tensor.shape[0]} rows, expected {sum(sizes)} ({sizes})")
    return list(torch.split(tensor, sizes, dim=0))
