"""The scheduler's side of speculative decoding: drafts before the step, rollback after it.

Before a step, a request that is decoding (exactly one known token without KV)
gets up to ``num_speculative_tokens`` drafts; it is scheduled for ``1 + k``
tokens and the KV cache gives slots to all of them. The runner verifies the
drafts in the same forward pass and returns the accepted ones plus one token of
the target's own. After the step the rejected drafts are rolled back::

    before:  computed C, known C + 1        scheduled 1 + k, computed -> C + 1 + k
    after:   a drafts accepted              known C + 2 + a, computed C + 1 + a
             blocks beyond cdiv(C + 1 + a, block_size) return to the pool

Draft tokens are never hashed into the prefix cache (only known tokens are), so
the blocks given back hold nothing anyone can find. Requests whose sampling
reads the token history or the raw distribution (grammars, logprobs, penalties,
logit edits) get no drafts: they decode one token at a time, exactly as without
speculation.
"""
from __future__ import annotations

from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.engine.request import Request
from minivllm.sample.metadata import has_logits_edits
from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.metrics import SpecDecodingStats
from minivllm.spec_decode.ngram_proposer import NgramProposer


class SpecDecodeScheduling:
    def __init__(self, cfg: SpeculativeConfig, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.proposer = NgramProposer(cfg.prompt_lookup_min, cfg.prompt_lookup_max, cfg.num_speculative_tokens)
        self.stats = SpecDecodingStats()

    def drafts_for(self, request: Request, num_new: int, budget: int) -> list[int]:
        """Drafts for a request about to be scheduled for ``num_new`` tokens ([] when it may not speculate)."""
        if num_new != 1 or not _may_speculate(request):
            return []
        room = min(
            budget - 1,
            self.max_model_len - request.num_tokens,
            request.max_tokens - request.num_output_tokens - 1,  # the last token needs no draft after it
        )
        if room <= 0:
            return []
        return self.proposer.propose(request.all_token_ids, room)

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


def _may_speculate(request: Request) -> bool:
    p = request.sampling_params
    return p.logprobs is None and p.structured_outputs is None and not has_logits_edits(p)
