"""LoRA wrappers around the base model's linear layers.

A wrapper keeps the base layer (weights, quantization, TP sharding untouched)
and, per fused member (q/k/v of ``qkv_proj``, gate/up of ``gate_up_proj``, or
the whole of ``o_proj`` / ``down_proj``), stacked slot tensors
``A`` (slots, in, max_rank) and ``B`` (slots, max_rank, out). A slot holding an
adapter of rank r < max_rank has zeros beyond r, so the sum is unchanged; a
slot an adapter does not target for this module stays zero.

Tensor parallelism follows the base layer: a column-parallel layer keeps the
whole A and its ranks' columns of B (its output stays split); a row-parallel
layer keeps its rows of A, and the (T, max_rank) shrink results are summed over
the ranks before the expand with the whole B.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.distributed.parallel_state import all_reduce
from minivllm.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from minivllm.lora.punica import LoRAStepContext, add_lora
from minivllm.lora.triton_ops import lora_shrink_expand

# our fused module -> the checkpoint (PEFT) module of each member, in output order
MEMBERS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "o_proj": ("o_proj",),
    "down_proj": ("down_proj",),
}


class LoRALinear(nn.Module):
    """``base(x)`` plus each token's adapter delta, member by member."""

    def __init__(
        self,
        base: ReplicatedLinear,
        members: tuple[str, ...],
        ctx: LoRAStepContext,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.base = base
        self.members = members
        self.ctx = ctx
        shape = base.linear_shape
        in_features = shape.input_size_per_partition
        sizes = list(shape.output_sizes) if len(members) > 1 else [shape.output_size_per_partition]
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.sizes = sizes
        self.in_features = in_features
        row_parallel = isinstance(base, RowParallelLinear) and base.tp_size > 1
        self.reduce = all_reduce if row_parallel else None
        self.lora_a = nn.ParameterList(
            nn.Parameter(torch.zeros(max_loras, in_features, max_rank, dtype=dtype, device=device), requires_grad=False)
            for _ in members
        )  # per member: (slots, in, max_rank)
        self.lora_b = nn.ParameterList(
            nn.Parameter(torch.zeros(max_loras, max_rank, n, dtype=dtype, device=device), requires_grad=False)
            for n in sizes
        )  # per member: (slots, max_rank, out)

    def __getattr__(self, name: str):
        """The base layer's attributes (``q_size``, ``kv_size``, ...) read through."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("base"), name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, in) -> (T, out)
        out = self.base(x)
        groups = self.ctx.groups
        if groups:
            for m, offset in enumerate(self.offsets):
                b = self.lora_b[m]
                target = out[:, offset : offset + b.shape[-1]]
                if x.is_cuda:
                    lora_shrink_expand(target, x, self.lora_a[m], b, *self.ctx.segments(), reduce=self.reduce)
                else:
                    add_lora(target, x, self.lora_a[m], b, groups, reduce=self.reduce)
        return out

    def set_slot(self, slot: int, pairs: list[tuple[torch.Tensor, torch.Tensor] | None]) -> None:
        """Write one adapter's (A (in, r), B (r, out)) per member into ``slot``; None zeroes the member."""
        for m, pair in enumerate(pairs):
            a, b = self.lora_a[m].data[slot], self.lora_b[m].data[slot]
            a.zero_()
            b.zero_()
            if pair is not None:
                full_a, full_b = pair
                rank = full_a.shape[1]
                a[:, :rank].copy_(full_a.narrow(0, self._in_start(), self.in_features))
                b[:rank].copy_(full_b.narrow(1, self._out_start(m), self.sizes[m]))

    def _in_start(self) -> int:
        """This rank's first input feature (row-parallel layers hold a slice)."""
        base = self.base
        return base.tp_rank * self.in_features if isinstance(base, RowParallelLinear) else 0

    def _out_start(self, member: int) -> int:
        """This rank's first output feature of ``member`` in the full (checkpoint) layout."""
        base = self.base
        if not isinstance(base, ColumnParallelLinear):
            return 0
        if isinstance(base, QKVParallelLinear) and member > 0:  # k, v: KV heads may be replicated
            return (base.tp_rank // base.kv_replicas) * self.sizes[member]
        return base.tp_rank * self.sizes[member]


def wrap_lora_layers(
    model: nn.Module, ctx: LoRAStepContext, max_loras: int, max_rank: int, dtype: torch.dtype, device: torch.device
) -> dict[tuple[int, str], LoRALinear]:
    """Replace every targetable linear of the decoder layers by a ``LoRALinear``;
    returns them by (layer index, our module name)."""
    wrapped: dict[tuple[int, str], LoRALinear] = {}
    for name, module in list(model.named_modules()):
        parts = name.split(".")
        if parts[-1] not in MEMBERS or "layers" not in parts or not isinstance(module, ReplicatedLinear):
            continue
        _check_layout(name, module)
        layer = int(parts[parts.index("layers") + 1])
        parent = model.get_submodule(".".join(parts[:-1]))
        lora = LoRALinear(module, MEMBERS[parts[-1]], ctx, max_loras, max_rank, dtype, device)
        setattr(parent, parts[-1], lora)
        wrapped[(layer, parts[-1])] = lora
    if not wrapped:
        raise ValueError(f"lora.enable_lora: {type(model).__name__} has no q/k/v/o or gate/up/down linears to adapt")
    return wrapped


def _check_layout(name: str, module: ReplicatedLinear) -> None:
    expected = {"qkv_proj": QKVParallelLinear, "gate_up_proj": MergedColumnParallelLinear}.get(name.split(".")[-1])
    if expected is not None and not isinstance(module, expected):
        raise ValueError(f"lora.enable_lora: {name} is a {type(module).__name__}, expected a {expected.__name__}")
