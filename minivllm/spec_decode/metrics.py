"""Counters of speculative decoding since the engine started (vLLM's spec-decode metrics)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpecDecodingStats:
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
