"""Repetition, presence and frequency penalties, batched over the rows that sample.

Each step builds two (N, V) tensors from the rows' token ids by ``scatter_add``
over padded id tensors (the padding id is an extra, discarded column ``V``):

    prompt_mask[r, t]    token t occurs in row r's prompt
    output_counts[r, t]  how often token t occurs in row r's output so far

then, with vLLM's (and transformers') semantics::

    repetition:  tokens in prompt or output: logit / p if logit > 0 else logit * p
    frequency:   logit -= frequency_penalty * output_counts
    presence:    logit -= presence_penalty * (output_counts > 0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minivllm.sample.history import TokenHistory
from minivllm.sampling_params import SamplingParams


@dataclass
class PenaltyTensors:
    repetition: torch.Tensor | None
    """(N,) fp32, 1.0 where off; None when no row uses it (and so for the two below)."""
    presence: torch.Tensor | None
    """(N,) fp32, 0.0 where off."""
    frequency: torch.Tensor | None
    """(N,) fp32, 0.0 where off."""
    prompt_mask: torch.Tensor | None
    """(N, V) bool: the token occurs in the row's prompt; only built for the repetition penalty."""
    output_counts: torch.Tensor
    """(N, V) fp32: occurrences of the token in the row's output."""

    @classmethod
    def build(
        cls, params: list[SamplingParams], history: TokenHistory, vocab_size: int, device: torch.device
    ) -> "PenaltyTensors | None":
        """None when no row uses a penalty; rows without penalties contribute no ids."""
        uses = [p.needs_penalties for p in params]
        if not any(uses):
            return None
        output_ids = [history.output(row) if u else [] for row, u in enumerate(uses)]
        repetition = _per_row([p.repetition_penalty for p in params], 1.0, device)
        prompt_mask = None
        if repetition is not None:
            prompt_ids = [history.prompt(row) if u else [] for row, u in enumerate(uses)]
            prompt_mask = token_counts(prompt_ids, vocab_size, device) > 0
        return cls(
            repetition=repetition,
            presence=_per_row([p.presence_penalty for p in params], 0.0, device),
            frequency=_per_row([p.frequency_penalty for p in params], 0.0, device),
            prompt_mask=prompt_mask,
            output_counts=token_counts(output_ids, vocab_size, device),
        )


def _per_row(values: list[float], neutral: float, device: torch.device) -> torch.Tensor | None:
    if all(v == neutral for v in values):
        return None
    return torch.tensor(values, dtype=torch.float32, device=device)


def token_counts(rows: list[list[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """(N, V) fp32 occurrence counts of each token id in each row."""
    width = max((len(r) for r in rows), default=0)
    padded = np.full((len(rows), max(width, 1)), vocab_size, dtype=np.int64)  # (N, L), pad = V
    for i, r in enumerate(rows):
        padded[i, : len(r)] = r
    ids = torch.from_numpy(padded).to(device)
    counts = torch.zeros(len(rows), vocab_size + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_penalties(logits: torch.Tensor, t: PenaltyTensors) -> torch.Tensor:
    """logits: (N, V) fp32, a buffer the caller owns -> penalized logits (may be the same buffer)."""
    in_output = t.output_counts > 0  # (N, V)
    if t.repetition is not None:
        rep = torch.where(in_output | t.prompt_mask, t.repetition.unsqueeze(1), 1.0)  # (N, V)
        logits = torch.where(logits > 0, logits / rep, logits * rep)
    if t.frequency is not None:
        logits -= t.frequency.unsqueeze(1) * t.output_counts
    if t.presence is not None:
        logits -= t.presence.unsqueeze(1) * in_output
    return logits
