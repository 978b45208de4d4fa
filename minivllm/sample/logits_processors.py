"""Per-request logit edits that do not depend on the sampling temperature:
allowed_token_ids, bad_words, min_tokens, logit_bias, the penalties, and the
user's own per-request logits processors.

They are applied in vLLM's order (masks, then logit_bias, then penalties, then
the user's callables), on the whole batch at once. Building the per-step index
lists loops over the requests (and over each request's own short lists of ids),
never over the vocabulary; the edits themselves are one ``index_put_`` or
``masked_fill_`` each. Every edit that reads the tokens a row has seen (penalties,
bad words, min_tokens, the user's callables) reads them from one ``TokenHistory``.

**Penalties** (repetition, presence, frequency) are batched over the rows that
sample. Each step builds two (N, V) tensors from the rows' token ids by
``scatter_add`` over padded id tensors (the padding id is an extra, discarded
column ``V``)::

    prompt_mask[r, t]    token t occurs in row r's prompt
    output_counts[r, t]  how often token t occurs in row r's output so far

then weighs them with the rows' penalties (``SamplingMetadata``'s (N,) tensors), with
vLLM's (and transformers') semantics::

    repetition:  tokens in prompt or output: logit / p if logit > 0 else logit * p
    frequency:   logit -= frequency_penalty * output_counts
    presence:    logit -= presence_penalty * (output_counts > 0)

**Per-request logits processors** (``SamplingParams.logits_processors``) are vLLM's older
per-request contract: user callables ``(output_token_ids, logits) -> logits``, each seeing
one row's (vocab,) logits and the tokens generated so far. They cannot be batched, so they
run row by row, last, and only for the rows of requests that set them; every other row
(and every step of a batch without them) takes the batched path untouched.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from minivllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from minivllm.sample.metadata import SamplingMetadata

_Index = tuple[torch.Tensor, torch.Tensor]
"""(rows, token ids): two (M,) int64 tensors naming logits to edit."""


@dataclass(frozen=True)
class TokenHistory:
    """The tokens each sampling row has seen. ``token_ids[i]``: row i's prompt (its first
    ``num_prompt_tokens[i]``) followed by its output so far."""

    token_ids: list[list[int]]
    num_prompt_tokens: list[int]

    def prompt(self, row: int) -> list[int]:
        return self.token_ids[row][: self.num_prompt_tokens[row]]

    def output(self, row: int) -> list[int]:
        return self.token_ids[row][self.num_prompt_tokens[row] :]


@dataclass
class LogitsEdits:
    banned: _Index | None
    """Set to -inf: the last token of a matched bad word; stop tokens before min_tokens."""
    disallowed: torch.Tensor | None
    """(N, V) bool, True outside a row's allowed_token_ids; None when no row restricts."""
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    """(rows, token ids, fp32 values) added to the logits."""
    penalties: PenaltyCounts | None
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
            penalties=PenaltyCounts.build(params, history, vocab_size, device),
            custom=CustomProcessors.build(params, history),
        )
        parts = (edits.banned, edits.disallowed, edits.bias, edits.penalties, edits.custom)
        if all(part is None for part in parts):
            return None
        return edits

    def apply(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """(N, V) fp32 raw logits -> edited logits (a new tensor; the input is left as is).
        ``meta``: the same rows' sampling inputs (their penalties)."""
        logits = logits.clone()
        if self.disallowed is not None:
            logits.masked_fill_(self.disallowed, float("-inf"))
        if self.banned is not None:
            logits.index_put_(self.banned, torch.tensor(float("-inf"), device=logits.device))
        if self.bias is not None:
            rows, cols, values = self.bias
            logits.index_put_((rows, cols), values, accumulate=True)
        if self.penalties is not None:
            logits = apply_penalties(logits, meta, self.penalties)
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


# ---- penalties ----------------------------------------------------------------------------
@dataclass
class PenaltyCounts:
    """The token statistics the penalties weigh (the weights are the metadata's per-row penalties)."""

    prompt_mask: torch.Tensor | None
    """(N, V) bool: the token occurs in the row's prompt; only built for the repetition penalty."""
    output_counts: torch.Tensor
    """(N, V) fp32: occurrences of the token in the row's output."""

    @classmethod
    def build(
        cls, params: list[SamplingParams], history: TokenHistory, vocab_size: int, device: torch.device
    ) -> "PenaltyCounts | None":
        """None when no row uses a penalty; rows without penalties contribute no ids."""
        uses = [p.needs_penalties for p in params]
        if not any(uses):
            return None
        output_ids = [history.output(row) if u else [] for row, u in enumerate(uses)]
        prompt_mask = None
        if any(p.repetition_penalty != 1.0 for p in params):
            prompt_ids = [history.prompt(row) if u else [] for row, u in enumerate(uses)]
            prompt_mask = token_counts(prompt_ids, vocab_size, device) > 0
        return cls(prompt_mask=prompt_mask, output_counts=token_counts(output_ids, vocab_size, device))


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


def apply_penalties(logits: torch.Tensor, meta: SamplingMetadata, counts: PenaltyCounts) -> torch.Tensor:
    """logits: (N, V) fp32, a buffer the caller owns -> penalized logits (may be the same buffer).
    ``meta``'s (N,) penalties are None where no row uses them."""
    in_output = counts.output_counts > 0  # (N, V)
    if meta.repetition_penalty is not None:
        rep = torch.where(in_output | counts.prompt_mask, meta.repetition_penalty.unsqueeze(1), 1.0)  # (N, V)
        logits = torch.where(logits > 0, logits / rep, logits * rep)
    if meta.frequency_penalty is not None:
        logits -= meta.frequency_penalty.unsqueeze(1) * counts.output_counts
    if meta.presence_penalty is not None:
        logits -= meta.presence_penalty.unsqueeze(1) * in_output
    return logits


# ---- the user's per-request callables ------------------------------------------------------
@dataclass
class CustomProcessors:
    rows: list[tuple[int, list[Callable[..., Any]], list[int]]]
    """(row, the request's callables, its output token ids so far)."""

    @classmethod
    def build(cls, params: list[SamplingParams], history: TokenHistory) -> "CustomProcessors | None":
        rows = [(row, p.logits_processors, history.output(row)) for row, p in enumerate(params) if p.logits_processors]
        return cls(rows) if rows else None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """(N, V) logits, edited in place row by row; a callable that returns the wrong shape is an error."""
        for row, processors, output_ids in self.rows:
            values = logits[row]  # (V,)
            for proc in processors:
                values = proc(output_ids, values)
                if not isinstance(values, torch.Tensor) or values.shape != logits[row].shape:
                    raise ValueError(
                        f"logits_processors: {getattr(proc, '__name__', proc)!r} must return a tensor of shape "
                        f"{tuple(logits[row].shape)}"
                    )
            logits[row] = values
        return logits


def check_picklable(params: SamplingParams) -> None:
    """Callables that must reach another process (tp > 1 workers, AsyncLLM's engine process) must
    pickle: a lambda or a local function cannot; a module-level function or class instance can."""
    if not params.logits_processors:
        return
    try:
        pickle.dumps(params.logits_processors)
    except Exception as err:  # noqa: BLE001 - pickle raises several types
        raise ValueError(
            f"logits_processors: must be picklable to run in another process (define them at module level): {err}"
        ) from None
