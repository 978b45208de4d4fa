"""Verification of draft tokens that keeps the target model's distribution exactly.

Each verified request contributes ``k + 1`` rows of target logits: one per draft
(the distribution the draft must come from) and one *bonus* row after the last
draft. Per row, with ``p`` the target's processed distribution (temperature,
min-p, top-k / top-p, exactly as the plain sampler) and ``d`` the draft:

- greedy rows accept ``d`` iff ``d == argmax p``; the row's own token is the argmax;
- random rows accept ``d`` with probability ``min(1, p(d) / q(d))``; the proposers
  here are deterministic (``q`` is one-hot at ``d``), so that is ``p(d)``. On a
  rejection the token is drawn from the residual ``max(p - q, 0)``, i.e. ``p``
  with ``d`` removed and renormalized. The bonus row draws from ``p``.

The emitted tokens of a request are its drafts up to the first rejection, then
that row's own token. Its first token is distributed exactly as ``p``:
``p(d)`` for ``d`` and ``(1 - p(d)) * p(x) / (1 - p(d)) = p(x)`` for every other
``x``; later rows follow by induction. Everything is batched on the device; the
host only walks the accept flags.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VerifyInputs:
    draft_token_ids: torch.Tensor
    """(N,) int64: each row's draft token, -1 on bonus rows."""
    greedy: torch.Tensor
    """(N,) bool: rows of greedy requests."""
    uniform: torch.Tensor
    """(N,) fp32 in [0, 1): the accept draw of each row."""
    exponential: torch.Tensor
    """(N, V) fp32 Exp(1) noise for the row's own token (the exponential race)."""


def rejection_sample(
    raw_logits: torch.Tensor, probs: torch.Tensor, inputs: VerifyInputs
) -> tuple[torch.Tensor, torch.Tensor]:
    """``raw_logits``: (N, V) target logits (greedy rows take their argmax); ``probs``: (N, V)
    processed target distribution. Returns (N,) int64 each row's own token and (N,) bool accepted."""
    drafts = inputs.draft_token_ids
    has_draft = drafts >= 0
    safe = drafts.clamp(min=0).unsqueeze(1)  # (N, 1)
    argmax = raw_logits.argmax(dim=-1)
    p_draft = probs.gather(1, safe).squeeze(1)
    accepted = torch.where(inputs.greedy, drafts == argmax, inputs.uniform < p_draft) & has_draft
    residual = probs.scatter(1, safe, torch.zeros_like(safe, dtype=probs.dtype))
    residual = torch.where(has_draft.unsqueeze(1), residual, probs)
    recovered = residual.div(inputs.exponential).argmax(dim=-1)
    own = torch.where(inputs.greedy, argmax, recovered)
    return own, accepted


def emitted_tokens(drafts: list[int], own: list[int], accepted: list[bool]) -> list[int]:
    """One request's output: drafts up to the first rejection, then that row's own token.
    ``own`` and ``accepted`` have ``len(drafts) + 1`` entries (the last is the bonus row)."""
    out = []
    for i, draft in enumerate(drafts):
        if not accepted[i]:
            return out + [own[i]]
        out.append(draft)
    return out + [own[len(drafts)]]
