"""The MoE layer: a router and stacked experts, sharded over the tensor-parallel group.

All experts' weights live in two stacked parameters, as the fused kernel wants them::

    w13  (E_local, 2 * I_local, H)   rows [gate_proj; up_proj] of each expert (HF w1; w3)
    w2   (E_local, H, I_local)       down_proj (HF w2)

Two ways to spread them over the ``tp`` ranks of the tensor-parallel group:

* tensor parallel (default): every rank holds every expert, each expert's
  intermediate dim sliced ``tp`` ways (E_local = E, I_local = I / tp), exactly
  like a dense MLP's gate_up (column) and down (row) projections;
* expert parallel (``parallel.enable_expert_parallel``): each rank holds
  ``E / tp`` whole experts (E_local = E / tp, I_local = I).

Either way each rank produces a partial sum over the same tokens (its slice of
every expert, or its whole experts and zero for the rest), and one all-reduce
gives every rank the full output. Every rank routes every token: activations
are replicated in the tensor-parallel group.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minivllm.distributed.parallel_state import all_reduce, tp_rank, tp_size
from minivllm.layers.fused_moe.router import route, to_local_ids
from minivllm.layers.fused_moe.torch_experts import torch_fused_experts
from minivllm.layers.linear import ReplicatedLinear, divide
from minivllm.layers.weight_utils import copy_checked, narrow

ExpertShard = tuple[int, str]
"""(global expert id, "w1" | "w3" | "w2"): which checkpoint tensor a weight_loader call carries."""


def fused_experts(
    hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """The Triton kernel on CUDA, the torch reference elsewhere (same arguments and result)."""
    if hidden.is_cuda:
        from minivllm.layers.fused_moe.triton_experts import triton_fused_experts

        return triton_fused_experts(hidden, w13, w2, topk_weights, topk_ids)
    return torch_fused_experts(hidden, w13, w2, topk_weights, topk_ids)


class FusedMoE(nn.Module):
    """Experts of one layer, stacked; ``forward(hidden, router_logits)`` routes and combines."""

    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool,
        expert_parallel: bool = False,
    ) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.expert_parallel = expert_parallel and self.tp_size > 1
        if self.expert_parallel:
            self.num_local_experts = divide(num_experts, self.tp_size, "num_experts")
            self.local_intermediate = intermediate_size
        else:
            self.num_local_experts = num_experts
            self.local_intermediate = divide(intermediate_size, self.tp_size, "moe intermediate size")
        self.first_expert = self.tp_rank * self.num_local_experts if self.expert_parallel else 0
        E, I = self.num_local_experts, self.local_intermediate
        self.w13 = nn.Parameter(torch.empty(E, 2 * I, hidden_size), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(E, hidden_size, I), requires_grad=False)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: ExpertShard) -> None:
        """Copy this rank's part of one expert's w1, w3 or w2; experts held elsewhere are skipped unread."""
        expert, which = shard_id
        local = expert - self.first_expert
        if not 0 <= local < self.num_local_experts:
            return
        I = self.local_intermediate
        start = 0 if self.expert_parallel else self.tp_rank * I  # this rank's slice of the intermediate dim
        if which == "w2":  # (H, I_full): columns
            copy_checked(param.data[local], narrow(loaded, 1, start, I), f"experts.{expert}.w2")
        elif which in ("w1", "w3"):  # (I_full, H): rows, gate first then up
            offset = 0 if which == "w1" else I
            dest = param.data[local].narrow(0, offset, I)
            copy_checked(dest, narrow(loaded, 0, start, I), f"experts.{expert}.{which}")
        else:
            raise ValueError(f"expert weight {which!r}: expected w1, w2 or w3")

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """hidden (T, H), router_logits (T, E) -> (T, H), summed over the tensor-parallel group."""
        weights, ids = route(router_logits, self.top_k, self.renormalize)  # (T, k) each
        if self.expert_parallel:
            ids = to_local_ids(ids, self.first_expert, self.num_local_experts)
        out = fused_experts(hidden, self.w13, self.w2, weights, ids)
        return all_reduce(out) if self.tp_size > 1 else out


class SparseMoeBlock(nn.Module):
    """``gate`` (a replicated linear to one logit per expert) followed by the experts.

    The submodule names follow the checkpoints: ``gate.weight`` and
    ``experts.{e}.*`` (mapped into ``experts.w13`` / ``experts.w2``).
    """

    def __init__(self, hidden_size: int, moe: FusedMoE) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, moe.num_experts, bias=False)
        self.experts = moe

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H)
        return self.experts(hidden, self.gate(hidden))
