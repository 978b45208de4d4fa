"""Prompt logprobs a worker gathers for a request, chunk by chunk, until its first sample."""
from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.outputs import PositionLogprobs


@dataclass(slots=True)
class PromptLogprobsState:
    prompt_token_ids: list[int]
    num_logprobs: int
    """The request's ``prompt_logprobs`` (top-k alternatives per prompt token)."""
    entries: list[PositionLogprobs | None] = field(default_factory=lambda: [None])
    """Entry ``j`` is prompt token ``j``'s (its own logprob and rank, then the top-k); entry 0 is None."""

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def add(self, first_token: int, entries: list[PositionLogprobs]) -> None:
        """Entries for prompt tokens ``first_token ..``; tokens skipped before it
        (KV reused from a cache, so never computed here) get None."""
        self.entries.extend([None] * (first_token - len(self.entries)))
        self.entries.extend(entries)
