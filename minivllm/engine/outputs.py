"""What users get back: vLLM's RequestOutput and CompletionOutput."""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.engine.logprob import Logprob

Logprobs = list[dict[int, Logprob]]
"""One {token_id: Logprob} dict per position."""


@dataclass
class CompletionOutput:
    index: int
    """Which of the prompt's ``n`` completions this is."""
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    """Sum of the chosen tokens' logprobs; None unless logprobs were asked for."""
    logprobs: Logprobs | None
    finish_reason: str | None = None
    """'stop', 'length' or 'abort' once finished."""
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended it (None for EOS or length)."""

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    """Timestamps and counts: arrival_time, first_token_time, finished_time."""
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache when the request was first scheduled."""
