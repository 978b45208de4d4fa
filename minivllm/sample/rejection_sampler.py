"""Verification of draft tokens that keeps the target model's distribution exactly.

Each verified request contributes ``k + 1`` rows of target logits: one per draft
(the distribution the draft must come from) and one *bonus* row after the last
draft. Per row, with ``p`` the target's processed distribution (temperature,
min-p, top-k / top-p, exactly as the plain sampler) and ``d`` the draft:

- greedy rows accept ``d`` iff ``d == argmax p``; the row's own token is the argmax;
- random rows accept ``d`` with probability ``min(1, p(d) / q(d))``, with ``q``
  the distribution the draft was drawn from. On a rejection the token is drawn
  from the residual ``max(p - q, 0)`` (renormalized). The bonus row draws from ``p``.

``q`` is one-hot at ``d`` for deterministic proposers (n-gram, greedy draft
models): then acceptance is ``p(d)`` and the residual is ``p`` without ``d``. A
sampling draft model passes its own (N, V) distributions (``draft_probs``).
For one-hot drafts the engine's verifier uses the equivalent coupled form (the
row's plain sample, accepted iff it equals ``d``: ``DraftVerifier._sample_and_match``),
which draws the plain sampler's noise; this function serves sampled drafts.

The emitted tokens of a request are its drafts up to the first rejection, then
that row's own token. Its first token is distributed exactly as ``p``: token
``x`` comes out accepted with probability ``q(x) min(1, p(x)/q(x)) = min(q(x), p(x))``
and resampled with probability ``(sum_y max(q(y) - p(y), 0)) * max(p(x) - q(x), 0) / Z``
where ``Z = sum_y max(p(y) - q(y), 0)`` equals that same sum, so the total is
``min(q, p)(x) + max(p - q, 0)(x) = p(x)``; later rows follow by induction.
Everything is batched on the device; the host only walks the accept flags.
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
    draft_probs: torch.Tensor | None = None
    """(N, V) fp32 the distribution each row's draft was drawn from (zeros on bonus rows);
    None: every draft is deterministic (one-hot)."""


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
    if inputs.draft_probs is None:  # one-hot q: accept with p(d), resample from p without d
        random_accept = inputs.uniform < p_draft
        residual = probs.scatter(1, safe, torch.zeros_like(safe, dtype=probs.dtype))
    else:
        q = inputs.draft_probs
        random_accept = inputs.uniform * q.gather(1, safe).squeeze(1) < p_draft  # u < p(d) / q(d)
        residual = (probs - q).clamp(min=0)
        residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, probs)  # p == q: never used
    accepted = torch.where(inputs.greedy, drafts == argmax, random_accept) & has_draft
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
