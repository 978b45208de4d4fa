"""The reference expert computation in plain torch (the CPU path).

The (token, slot) pairs are sorted by expert once; then for each local expert
that received any: gather its tokens, run its SwiGLU MLP on those only, scale
by the routing weight and add into the tokens' outputs. Experts that receive
no token cost nothing, and neither do pairs whose expert is on another rank (id -1).
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
