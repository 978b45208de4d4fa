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
class SpecDecodingStats:
    """Speculative decoding since the engine started (vLLM's spec-decode metrics)."""

    num_drafts: int = 0
    """Verification steps of a request that had at least one draft token."""
    num_draft_tokens: int = 0
    """Draft tokens proposed (and verified)."""
    num_accepted_tokens: int = 0
    """Draft tokens the target model accepted."""

    def record(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens

    def as_scheduler_stats(self) -> dict:
        """The ``SchedulerStats`` fields these counters fill."""
        return dict(
            spec_decoding=True,
            spec_num_drafts=self.num_drafts,
            spec_num_draft_tokens=self.num_draft_tokens,
            spec_num_accepted_tokens=self.num_accepted_tokens,
        )

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens, in [0, 1]."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verification step emits on average: the accepted drafts plus the target's own token."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


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
    external_prefix_cache_queries: int = 0
    """With a KV connector: prompt tokens looked up past the device's hits (vLLM's external prefix cache)."""
    external_prefix_cache_hits: int = 0
    """Of those, tokens loaded through the connector (host memory, shared storage)."""
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
