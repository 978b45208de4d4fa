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

Which parameters exist and how the matmul runs is up to the layer's
``LinearMethod`` (minivllm/quantization/): each parameter comes with a
``ParamSpec`` naming its output / input dims, and the loaders below slice along
those, so one loader serves a plain weight, an fp8 weight with its scales and
a packed int4 weight.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from minivllm.distributed.parallel_state import all_reduce, tp_rank, tp_size
from minivllm.layers.weight_utils import as_tensor, copy_checked, loaded_shape, narrow
from minivllm.quantization.base import (
    CpuPackedWeight,
    LinearMethod,
    LinearShape,
    ParamSpec,
    UnquantizedLinearMethod,
    pack_cpu_weight,
    packable_on_cpu,
    place_cpu_weight,
)


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what}={numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator


class ReplicatedLinear(nn.Module):
    """Every rank holds the whole layer; the base of the sharded layers below."""

    cpu_packed_weight: CpuPackedWeight | None = None
    """The unquantized weight packed for the CPU's matmul (``device.cpu_packed_linear``,
    ``pack_cpu_weight``); ``UnquantizedLinearMethod.apply`` runs on it. None: F.linear on ``weight``."""

    def __init__(self, in_features: int, out_features: int, bias: bool, *, full_in: int | None = None) -> None:
        super().__init__()
        self.linear_shape = LinearShape(in_features, self._member_sizes(out_features), full_in or in_features)
        self.param_specs: dict[str, ParamSpec] = {}
        self.set_quant_method(UnquantizedLinearMethod(), torch.get_default_dtype())
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def _member_sizes(self, out_features: int) -> tuple[int, ...]:
        """Local output features of each fused member (one member unless fused)."""
        return (out_features,)

    def set_quant_method(self, method: LinearMethod, params_dtype: torch.dtype) -> None:
        """Drop the current weights (not the bias) and let ``method`` create its own."""
        for name in list(self.param_specs):
            delattr(self, name)
        self.param_specs = {}
        self.quant_method = method
        method.create_weights(self, self.linear_shape, params_dtype)

    def spec_of(self, param: nn.Parameter) -> ParamSpec:
        for name, p in self._parameters.items():
            if p is param:
                return self.param_specs.get(name, ParamSpec(out_dim=0))  # the bias: output features
        raise ValueError(f"{type(self).__name__}: parameter is not one of its own")

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        copy_whole(param, loaded, self.spec_of(param).broadcast)

    def pack_for_cpu(self) -> bool:
        """Hold the weight packed for the CPU (``pack_cpu_weight``) where the layer is unquantized and
        on the CPU in fp32 or bf16; returns whether it did."""
        if type(self.quant_method) is not UnquantizedLinearMethod or not packable_on_cpu(self.weight):
            return False
        self.weight.data = place_cpu_weight(self.weight.data)
        self.cpu_packed_weight = pack_cpu_weight(self.weight)
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ColumnParallelLinear(ReplicatedLinear):
    """Output features split over ranks; the output stays split (no gather)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        super().__init__(in_features, divide(out_features, self.tp_size, "output features"), bias)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        spec = self.spec_of(param)
        if spec.out_dim is None:
            copy_whole(param, loaded)
            return
        size = param.shape[spec.out_dim]
        copy_slice(param.data, loaded, spec.out_dim, self.tp_rank * size, size, spec.broadcast)

    def _load_member(self, param: nn.Parameter, loaded: Any, member: int, offset: int, size: int, start: int) -> None:
        """Copy fused member ``member`` (local rows ``offset:offset+size`` in logical output
        features, read from checkpoint rows ``start:start+size``) into ``param``."""
        spec = self.spec_of(param)
        if spec.per_member:
            copy_whole(param.data[member : member + 1], loaded)
        elif spec.out_dim is None:
            copy_whole(param, loaded)
        else:
            dim, pack = spec.out_dim, spec.out_pack
            target = param.data.narrow(dim, offset // pack, size // pack)
            copy_slice(target, loaded, dim, start // pack, size // pack, spec.broadcast)

    def _split_fused(self, param: nn.Parameter, loaded: Any, full_sizes: list[int], shard_ids: list[Any]) -> None:
        """The checkpoint holds the fused tensor (e.g. Phi-3): split it into its members."""
        spec = self.spec_of(param)
        if spec.out_dim is None or spec.per_member:
            raise ValueError(f"{type(self).__name__}: a fused checkpoint tensor needs per-member tensors here")
        parts = _split_along(as_tensor(loaded), [s // spec.out_pack for s in full_sizes], spec.out_dim)
        for sid, part in zip(shard_ids, parts):
            self.weight_loader(param, part, sid)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel layers fused into one matmul (e.g. gate and up).

    The local weight is ``[gate_shard; up_shard]``: each rank keeps its slice of
    every member, not a slice of the concatenation.
    """

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = True) -> None:
        self.out_sizes = out_sizes
        super().__init__(in_features, sum(out_sizes), bias)

    def _member_sizes(self, out_features: int) -> tuple[int, ...]:
        return tuple(s // self.tp_size for s in self.out_sizes)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        if shard_id is None:  # the checkpoint already holds the fused tensor (e.g. Phi-3)
            self._split_fused(param, loaded, self.out_sizes, list(range(len(self.out_sizes))))
            return
        size = self.out_sizes[shard_id] // self.tp_size
        offset = sum(self.out_sizes[:shard_id]) // self.tp_size
        self._load_member(param, loaded, shard_id, offset, size, self.tp_rank * size)


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

    def _member_sizes(self, out_features: int) -> tuple[int, ...]:
        return (self.q_size, self.kv_size, self.kv_size)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        if shard_id is None:  # fused qkv in the checkpoint: split it into its members first
            spec = self.spec_of(param)
            rows = loaded_shape(loaded)[spec.out_dim or 0] * spec.out_pack
            full_q = self.q_size * self.tp_size
            full_kv = (rows - full_q) // 2
            self._split_fused(param, loaded, [full_q, full_kv, full_kv], list("qkv"))
            return
        if shard_id == "q":
            offset, size, rank_start = 0, self.q_size, self.tp_rank * self.q_size
        else:
            kv_rank = self.tp_rank // self.kv_replicas
            offset = self.q_size + (0 if shard_id == "k" else self.kv_size)
            size, rank_start = self.kv_size, kv_rank * self.kv_size
        self._load_member(param, loaded, "qkv".index(shard_id), offset, size, rank_start)


class RowParallelLinear(ReplicatedLinear):
    """Input features split over ranks; partial outputs are summed across ranks."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        local_in = divide(in_features, self.tp_size, "input features")
        super().__init__(local_in, out_features, bias, full_in=in_features)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        spec = self.spec_of(param) if param is not self.bias else ParamSpec()
        if spec.in_dim is None:  # the bias (added once, after the reduction), scales
            copy_whole(param, loaded, spec.broadcast)
            return
        size = param.shape[spec.in_dim]
        copy_slice(param.data, loaded, spec.in_dim, self.tp_rank * size, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.quant_method.apply(self, x, None)
        if self.tp_size > 1:
            y = all_reduce(y)
        return y if self.bias is None else y + self.bias


def copy_whole(target: torch.Tensor, loaded: Any, broadcast: bool = False) -> None:
    """Copy a whole checkpoint tensor; (n, 1) fits (n,) (scales are stored both ways), and
    with ``broadcast`` a scalar (a per-tensor scale) fills ``target``."""
    value = as_tensor(loaded)
    if broadcast and value.numel() == 1:
        target.data.fill_(value.reshape(()).item())
        return
    if value.shape != target.shape and value.squeeze().shape == target.squeeze().shape:
        value = value.reshape(target.shape)
    copy_checked(target, value)


def copy_slice(target: torch.Tensor, loaded: Any, dim: int, start: int, size: int, broadcast: bool = False) -> None:
    """Copy rows ``start:start+size`` of ``loaded`` along ``dim``; with ``broadcast`` a
    checkpoint scalar (a per-tensor scale) fills ``target`` instead."""
    shape = loaded_shape(loaded)
    if broadcast and math.prod(shape) == 1:
        target.fill_(as_tensor(loaded).reshape(()).item())
        return
    if len(shape) < target.dim() or len(shape) > target.dim() + 1:
        raise ValueError(f"checkpoint tensor of shape {shape} does not fit a parameter of shape {tuple(target.shape)}")
    value = narrow(loaded, dim, start, size)
    if value.dim() == target.dim() + 1 and value.shape[-1] == 1:  # (n, 1) scales into (n,)
        value = value.squeeze(-1)
    copy_checked(target, value)


def _split_along(tensor: torch.Tensor, sizes: list[int], dim: int) -> list[torch.Tensor]:
    if tensor.shape[dim] != sum(sizes):
        raise ValueError(f"fused weight has {tensor.shape[dim]} rows, expected {sum(sizes)} ({sizes})")
    return list(torch.split(tensor, sizes, dim=dim))
