"""What comes back from a step: the workers' ``ModelRunnerOutput``, the scheduler's
per-request ``EngineCoreOutput``, and the future a launched step returns.

These types cross the boundaries between workers, executor, scheduler and engine,
so they sit at the bottom of the package graph next to ``minivllm/request.py``.

vLLM's user-facing import path works too: ``from minivllm.outputs import
RequestOutput, CompletionOutput, PoolingRequestOutput`` (and the embedding
classes) gives the front end's classes, imported on first use, so this module
stays free of the engine.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from minivllm.request import RequestId


class PositionLogprobs(NamedTuple):
    """One position's logprobs as a worker sends them (the front end wraps them in ``Logprob``)."""

    token_logprobs: dict[int, float]
    """The chosen (or prompt) token first, then the top-k asked for in descending
    order; a token that is both appears once."""
    rank: int
    """The chosen token's 1-based rank in the whole vocabulary: one more than the
    number of tokens strictly more likely."""


@dataclass
class ModelRunnerOutput:
    """Sampled tokens of one step, from rank 0."""

    sampled_token_ids: dict[RequestId, list[int]] = field(default_factory=dict)
    """Per request that finished its known tokens this step: the new token(s) (with
    speculative decoding: the accepted drafts, then the target's own token).
    Requests in the middle of a prefill chunk get no entry."""
    logprobs: dict[RequestId, list[PositionLogprobs]] = field(default_factory=dict)
    """Per sampled token: the chosen token's and the top-k's logprobs, and the chosen one's rank."""
    prompt_logprobs: dict[RequestId, list[PositionLogprobs | None]] = field(default_factory=dict)
    """For requests that asked and sampled their first token this step: one
    entry per prompt token (the prompt token's own logprob and rank, then the top-k),
    the first entry None. Workers gather them chunk by chunk during prefill."""
    pooler_output: dict[RequestId, Any] = field(default_factory=dict)
    """runner=pooling: per request whose prompt completed this step, its pooled (H,) fp32 CPU tensor."""
    spec_token_ids: dict[RequestId, list[int]] = field(default_factory=dict)
    """Speculative decoding with a draft model: per request that sampled, the drafts it
    proposes to follow this step's tokens (the scheduler schedules them next step)."""


@dataclass(slots=True)
class EngineCoreOutput:
    """New tokens of one request after one step."""

    req_id: RequestId
    new_token_ids: list[int]
    new_logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    """With the first new token of a request that asked: one entry per prompt token (the first None)."""
    num_cached_tokens: int = 0
    """Prompt tokens the request found in the prefix cache when first scheduled."""
    pooling_output: Any = None
    """runner=pooling: the request's pooled (H,) tensor, with its one placeholder token."""


class StepResult(Protocol):
    """What launching a step returns: its output, once asked for."""

    @property
    def resolved(self) -> bool: ...

    def result(self) -> ModelRunnerOutput: ...


class DoneOutput:
    """A step with nothing to wait for (no request sampled)."""

    resolved = True

    def __init__(self, output: ModelRunnerOutput) -> None:
        self._output = output

    def result(self) -> ModelRunnerOutput:
        return self._output


_FRONT_END = {
    "RequestOutput": "minivllm.engine.outputs",
    "CompletionOutput": "minivllm.engine.outputs",
    "PoolingRequestOutput": "minivllm.pooling.outputs",
    "PoolingOutput": "minivllm.pooling.outputs",
    "EmbeddingRequestOutput": "minivllm.pooling.outputs",
    "EmbeddingOutput": "minivllm.pooling.outputs",
}
"""What ``LLM.generate`` / ``LLM.encode`` / ``LLM.embed`` return, by vLLM's module path."""


def __getattr__(name: str) -> Any:
    if name not in _FRONT_END:
        raise AttributeError(f"module 'minivllm.outputs' has no attribute {name!r}")
    return getattr(importlib.import_module(_FRONT_END[name]), name)
