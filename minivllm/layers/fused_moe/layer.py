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

Routing (``route``): both supported families take a softmax over all experts'
logits (in fp32) and keep the k largest probabilities. Mixtral then renormalizes
the k kept weights to sum to 1; Qwen3-MoE does so only when ``norm_topk_prob`` is
set, otherwise the weights are the raw softmax probabilities (summing to less than 1).

Checkpoint names (``expert_weight_target``): Hugging Face checkpoints store each
expert's projections separately::

    Qwen3-MoE:  ...mlp.experts.{e}.gate_proj.weight / up_proj / down_proj
    Mixtral:    ...block_sparse_moe.experts.{e}.w1.weight / w3 / w2

Both land in ``...experts.w13`` (gate = w1, up = w3) and ``...experts.w2``
with shard id ``(e, "w1" | "w3" | "w2")`` for ``FusedMoE.weight_loader``.

The CPU path (``torch_fused_experts``), the reference the Triton kernel
(``triton_experts.py``) is tested against: the (token, slot) pairs are sorted by
expert once; then for each local expert that received any: gather its tokens, run
its SwiGLU MLP on those only, scale by the routing weight and add into the tokens'
outputs. Experts that receive no token cost nothing, and neither do pairs whose
expert is on another rank (id -1).
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed.parallel_state import all_reduce, tp_rank, tp_size
from minivllm.layers.activation import silu_and_mul
from minivllm.layers.linear import ReplicatedLinear, divide
from minivllm.layers.weight_utils import copy_checked, narrow

ExpertShard = tuple[int, str]
"""(global expert id, "w1" | "w3" | "w2"): which checkpoint tensor a weight_loader call carries."""
_ROLE = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2", "w1": "w1", "w3": "w3", "w2": "w2"}
_EXPERT_TENSOR = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight$")


def expert_weight_target(name: str) -> tuple[str, Any] | None:
    """(parameter name, (expert, role)) for a per-expert tensor name, else None."""
    match = _EXPERT_TENSOR.match(name)
    if match is None or match["proj"] not in _ROLE:
        return None
    role = _ROLE[match["proj"]]
    param = "w2" if role == "w2" else "w13"
    return f"{match['prefix']}.{param}", (int(match["expert"]), role)


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, E) logits -> (weights (T, k) fp32, expert ids (T, k) int64), largest weight first."""
    if not 1 <= top_k <= router_logits.shape[-1]:
        raise ValueError(f"top_k={top_k} must be between 1 and the number of experts {router_logits.shape[-1]}")
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # (T, E)
    weights, ids = torch.topk(probs, top_k, dim=-1)  # (T, k)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def to_local_ids(topk_ids: torch.Tensor, first_expert: int, num_local: int) -> torch.Tensor:
    """Global expert ids -> this rank's local ids, -1 where the expert lives on another rank.

    With expert parallelism a rank holds experts ``first_expert ..
    first_expert + num_local - 1``; the entries marked -1 contribute nothing
    here and arrive through the all-reduce from the rank that holds them.
    """
    local = topk_ids - first_expert
    return torch.where((local >= 0) & (local < num_local), local, torch.full_like(local, -1))


def torch_fused_experts(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """sum_k weight[t, k] * expert_{ids[t, k]}(hidden[t]) over the local experts.

    hidden (T, H); w13 (E, 2I, H) = [gate; up] rows; w2 (E, H, I);
    topk_weights (T, k); topk_ids (T, k) local expert ids, -1 = not on this rank.
    Returns (T, H) in hidden's dtype.
    """
    k = topk_ids.shape[1]
    flat = topk_ids.flatten()  # (T*k,) pair t*k+s -> expert
    order = torch.argsort(flat, stable=True)  # pairs by expert, -1 first, tokens ascending within one
    counts = torch.bincount(flat + 1, minlength=w13.shape[0] + 1).tolist()  # [other ranks, expert 0, ...]
    flat_weights = topk_weights.flatten()
    out = torch.zeros_like(hidden)
    start = counts[0]
    for expert, n in enumerate(counts[1:]):
        if n == 0:
            continue
        pairs = order[start : start + n]
        start += n
        tokens = pairs // k
        y = F.linear(silu_and_mul(F.linear(hidden[tokens], w13[expert])), w2[expert])  # (n, H)
        out.index_add_(0, tokens, (y * flat_weights[pairs, None]).to(out.dtype))
    return out


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
