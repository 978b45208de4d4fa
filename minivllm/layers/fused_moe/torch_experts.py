"""The reference expert computation in plain torch (the CPU path).

For each local expert: gather the (token, slot) pairs routed to it, run its
SwiGLU MLP on those tokens only, scale by the routing weight and add into the
token's output. Experts that receive no token are skipped.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """(N, 2I) ``[gate | up]`` -> (N, I) ``silu(gate) * up``."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


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
    out = torch.zeros_like(hidden)
    for expert in range(w13.shape[0]):
        tokens, slots = torch.where(topk_ids == expert)
        if tokens.numel() == 0:
            continue
        x = hidden[tokens]  # (n, H)
        y = F.linear(silu_and_mul(F.linear(x, w13[expert])), w2[expert])  # (n, H)
        y = y * topk_weights[tokens, slots, None]
        out.index_add_(0, tokens, y.to(out.dtype))
    return out
