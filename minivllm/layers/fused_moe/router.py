"""Top-k routing: which experts each token visits, and with what weight.

Both supported families take a softmax over all experts' logits (in fp32) and
keep the k largest probabilities. Mixtral then renormalizes the k kept weights
to sum to 1; Qwen3-MoE does so only when ``norm_topk_prob`` is set, otherwise
the weights are the raw softmax probabilities (summing to less than 1).
"""

from __future__ import annotations

import torch


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
