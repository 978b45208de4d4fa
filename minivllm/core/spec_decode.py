"""The scheduler's side of speculative decoding: drafts before the step, rollback after it.

Before a step, a request that is decoding (exactly one known token without KV)
gets up to ``num_speculative_tokens`` drafts; it is scheduled for ``1 + k``
tokens and the KV cache gives slots to all of them. The runner verifies the
drafts in the same forward pass and returns the accepted ones plus one token of
the target's own. After the step the rejected drafts are rolled back::

    before:  computed C, known C + 1        scheduled 1 + k, computed -> C + 1 + k
    after:   a drafts accepted              known C + 2 + a, computed C + 1 + a
             blocks beyond cdiv(C + 1 + a, block_size) return to the pool

The drafts come from a ``DraftSource``, one interface with two implementations:
``NgramProposer`` looks them up in the request's own tokens here, and
``ModelDrafts`` hands out what the worker's draft model proposed after the
last step (``ModelRunnerOutput.spec_token_ids``). A draft model writes KV for
``k`` positions past a request's newest token while proposing, so a request
that samples in a step gets up to ``k`` *lookahead* slots beyond its scheduled
tokens (never by preempting anyone; the rollback frees them with the drafts').

Draft tokens are never hashed into the prefix cache (only known tokens are), so
the blocks given back hold nothing anyone can find. Requests whose sampling
reads the token history or the raw distribution (grammars, logprobs, penalties,
logit edits) get no drafts: they decode one token at a time, exactly as without
speculation.

Prompt lookup (``NgramProposer``): copy what followed the sequence's tail the
last time it occurred. For a sequence ``... a b c x y z ... a b c`` whose last
``n`` tokens (``a b c``) occur earlier, the tokens after that earlier occurrence
(``x y z``) are the drafts. The longest ``n`` in ``[prompt_lookup_min,
prompt_lookup_max]`` with a match wins, and of its matches the most recent one
that is followed by all ``k`` drafts (else the earliest, which has the most
followers). It needs only token ids, so it runs in the scheduler before each
step, with no model and no device.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from minivllm.config.speculative import SpeculativeConfig
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.stats import SpecDecodingStats
from minivllm.request import Request, RequestId
from minivllm.sample.metadata import may_speculate


class DraftSource(Protocol):
    def drafts(self, request: Request, max_num_drafts: int) -> list[int]:
        """Up to ``max_num_drafts`` drafts to follow the request's known tokens ([] for none)."""
        ...


class ModelDrafts:
    """The drafts the worker's draft model proposed after the last step, per request."""

    def __init__(self) -> None:
        self.latest: dict[RequestId, list[int]] = {}

    def receive(self, spec_token_ids: dict[RequestId, list[int]]) -> None:
        self.latest = spec_token_ids

    def drafts(self, request: Request, max_num_drafts: int) -> list[int]:
        return self.latest.get(request.request_id, [])[:max_num_drafts]


class NgramProposer:
    def __init__(self, min_n: int, max_n: int, max_num_drafts: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.max_num_drafts = max_num_drafts

    def propose(self, token_ids: list[int] | np.ndarray, max_num_drafts: int | None = None) -> list[int]:
        """Up to ``max_num_drafts`` (default the configured number) draft tokens; [] without a match."""
        k = self.max_num_drafts if max_num_drafts is None else min(max_num_drafts, self.max_num_drafts)
        tokens = np.asarray(token_ids, dtype=np.int64)
        if k <= 0 or len(tokens) <= self.min_n:
            return []
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            start = _best_match(tokens, n, k)
            if start is not None:
                return tokens[start + n : start + n + k].tolist()
        return []

    def drafts(self, request: Request, max_num_drafts: int) -> list[int]:
        """The ``DraftSource`` view: drafts from the request's own known tokens."""
        return self.propose(request.all_token_ids, max_num_drafts)


class SpecDecodeScheduling:
    def __init__(self, cfg: SpeculativeConfig, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.lookahead = cfg.num_speculative_tokens if cfg.uses_model else 0
        """Slots past a sampling request's tokens that the worker's proposer writes."""
        self.proposer: DraftSource = (
            ModelDrafts()
            if cfg.uses_model
            else NgramProposer(cfg.prompt_lookup_min, cfg.prompt_lookup_max, cfg.num_speculative_tokens)
        )
        self.stats = SpecDecodingStats()

    def plan(self, kv: KVCacheManager, request: Request, num_new: int, budget: int) -> tuple[list[int], int]:
        """Drafts for a running request about to be scheduled for ``num_new`` tokens, and the
        lookahead slots to reserve after them; both only where they fit without preempting."""
        drafts = self.drafts_for(request, num_new, budget)
        will_sample = request.num_computed_tokens + num_new >= request.num_tokens
        extra = 0
        if self.lookahead and will_sample and may_speculate(request.sampling_params):
            end = request.num_computed_tokens + num_new + len(drafts)
            extra = max(0, min(self.lookahead, self.max_model_len - end))
        if extra and not kv.can_allocate(request, num_new + len(drafts) + extra):
            extra = 0
        if drafts and not kv.can_allocate(request, num_new + len(drafts)):
            drafts = []
        return drafts, extra

    def drafts_for(self, request: Request, num_new: int, budget: int) -> list[int]:
        """Drafts for a request about to be scheduled for ``num_new`` tokens ([] when it may not speculate)."""
        if num_new != 1 or not may_speculate(request.sampling_params):
            return []
        room = min(
            budget - 1,
            self.max_model_len - request.num_tokens,
            request.max_tokens - request.num_output_tokens - 1,  # the last token needs no draft after it
        )
        if room <= 0:
            return []
        return self.proposer.drafts(request, room)

    def receive(self, spec_token_ids: dict[RequestId, list[int]]) -> None:
        """The worker's proposals after a step (draft models only)."""
        if isinstance(self.proposer, ModelDrafts):
            self.proposer.receive(spec_token_ids)

    def after_step(self, kv: KVCacheManager, request: Request, num_drafts: int, num_new_tokens: int) -> None:
        """After a step that verified ``num_drafts`` drafts and emitted ``num_new_tokens`` tokens:
        count them, and forget the KV of the rejected drafts (computed tokens and the blocks
        past them) unless the request finished (then all its blocks are gone already)."""
        num_accepted = num_new_tokens - 1
        self.stats.record(num_drafts, num_accepted)
        if request.is_finished:
            return
        request.num_computed_tokens -= num_drafts - num_accepted
        kv.truncate(request, request.num_computed_tokens)


def _best_match(tokens: np.ndarray, n: int, k: int) -> int | None:
    """Start of an earlier occurrence of the last ``n`` tokens: the latest one with ``k``
    tokens after it, else the earliest; None when there is none."""
    windows = sliding_window_view(tokens[:-1], n)  # (L - n, n): every window with a follower
    hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
    if not len(hits):
        return None
    full = hits[hits + n + k <= len(tokens)]
    return int(full[-1]) if len(full) else int(hits[0])
