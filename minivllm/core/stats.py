"""Counters the scheduler and KV-cache manager keep, read by the engine's stats logger."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since the engine started, counted in tokens (as vLLM does).

    A lookup happens when a request is admitted (again, after a preemption);
    ``hits`` are the prompt tokens whose KV came from the cache.
    """

    requests: int = 0
    queries: int = 0
    """Tokens looked up."""
    hits: int = 0
    """Tokens found."""

    def record(self, num_tokens: int, num_hits: int) -> None:
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits


@dataclass
class SchedulerStats:
    num_running: int = 0
    num_waiting: int = 0
    num_preemptions: int = 0
    """Preemptions since the engine started."""
    kv_cache_usage: float = 0.0
    num_free_blocks: int = 0
    num_blocks: int = 0
    num_preempted: int = 0
    """Waiting requests that were preempted and wait to resume."""
    prefix_cache_queries: int = 0
    """Tokens looked up in the prefix cache since the engine started."""
    prefix_cache_hits: int = 0
    """Of those, tokens found."""
    spec_decoding: bool = False
    """Whether speculative decoding is on (the spec_* counters below are then live)."""
    spec_num_drafts: int = 0
    """Verification steps of requests with drafts since the start."""
    spec_num_draft_tokens: int = 0
    """Draft tokens proposed since the start."""
    spec_num_accepted_tokens: int = 0
    """Of those, tokens the target model accepted."""

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
