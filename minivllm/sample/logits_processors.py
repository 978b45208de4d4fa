"""Per-request logit edits that do not depend on the sampling temperature:
allowed_token_ids, bad_words, min_tokens, logit_bias, and the penalties.

They are applied in vLLM's order (masks, then logit_bias, then penalties), on the
whole batch at once. Building the per-step index lists loops over the requests
(and over each request's own short lists of ids), never over the vocabulary;
the edits themselves are one ``index_put_`` or ``masked_fill_`` each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minivllm.sample.custom_processors import CustomProcessors
from minivllm.sample.history import TokenHistory
from minivllm.sample.penalties import PenaltyTensors, apply_penalties
from minivllm.sampling_params import SamplingParams

_Index = tuple[torch.Tensor, torch.Tensor]
"""(rows, token ids): two (M,) int64 tensors naming logits to edit."""


@dataclass
class LogitsEdits:
    banned: _Index | None
    """Set to -inf: the last token of a matched bad word; stop tokens before min_tokens."""
    disallowed: torch.Tensor | None
    """(N, V) bool, True outside a row's allowed_token_ids; None when no row restricts."""
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    """(rows, token ids, fp32 values) added to the logits."""
    penalties: PenaltyTensors | None
    custom: CustomProcessors | None = None
    """User callables of the requests that set ``logits_processors`` (row by row, last)."""

    @classmethod
    def build(
        cls, params: list[SamplingParams], history: TokenHistory, vocab_size: int, device: torch.device
    ) -> "LogitsEdits | None":
        """None when no row asks for any edit (the common case costs nothing)."""
        edits = cls(
            banned=_index(_banned_pairs(params, history), device),
            disallowed=_disallowed(params, vocab_size, device),
            bias=_bias(params, device),
            penalties=PenaltyTensors.build(params, history, vocab_size, device),
            custom=CustomProcessors.build(params, history),
        )
        parts = (edits.banned, edits.disallowed, edits.bias, edits.penalties, edits.custom)
        if all(part is None for part in parts):
            return None
        return edits

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """(N, V) fp32 raw logits -> edited logits (a new tensor; the input is left as is)."""
        logits = logits.clone()
        if self.disallowed is not None:
            logits.masked_fill_(self.disallowed, float("-inf"))
        if self.banned is not None:
            logits.index_put_(self.banned, torch.tensor(float("-inf"), device=logits.device))
        if self.bias is not None:
            rows, cols, values = self.bias
            logits.index_put_((rows, cols), values, accumulate=True)
        if self.penalties is not None:
            logits = apply_penalties(logits, self.penalties)
        if self.custom is not None:
            logits = self.custom.apply(logits)
        return logits


def _banned_pairs(params: list[SamplingParams], history: TokenHistory) -> list[tuple[int, int]]:
    """Stop tokens while min_tokens is not reached; the last token of each bad word whose
    other tokens end the output (vLLM matches bad words against the output only)."""
    pairs = []
    for row, (p, ids, num_prompt) in enumerate(zip(params, history.token_ids, history.num_prompt_tokens)):
        num_out = len(ids) - num_prompt
        if num_out < p.min_tokens:
            pairs.extend((row, t) for t in p._all_stop_token_ids)
        for word in p._bad_words_token_ids:
            prefix = word[:-1]
            if len(prefix) <= num_out and ids[len(ids) - len(prefix) :] == prefix:
                pairs.append((row, word[-1]))
    return pairs


def _index(pairs: list[tuple[int, int]], device: torch.device) -> _Index | None:
    if not pairs:
        return None
    both = torch.tensor(pairs, dtype=torch.int64, device=device)  # (M, 2)
    return both[:, 0], both[:, 1]


def _disallowed(params: list[SamplingParams], vocab_size: int, device: torch.device) -> torch.Tensor | None:
    restricted = [(row, p.allowed_token_ids) for row, p in enumerate(params) if p.allowed_token_ids is not None]
    if not restricted:
        return None
    mask = torch.zeros(len(params), vocab_size, dtype=torch.bool, device=device)
    rows = torch.tensor([row for row, _ in restricted], dtype=torch.int64, device=device)
    mask[rows] = True
    allowed = _index([(row, t) for row, ids in restricted for t in ids], device)
    mask[allowed] = False
    return mask


def _bias(params: list[SamplingParams], device: torch.device):
    triples = [(row, t, b) for row, p in enumerate(params) if p.logit_bias for t, b in p.logit_bias.items()]
    if not triples:
        return None
    rows, cols = _index([(row, t) for row, t, _ in triples], device)
    values = torch.tensor([b for _, _, b in triples], dtype=torch.float32, device=device)
    return rows, cols, values
