"""What comes back: the workers' ``ModelRunnerOutput``, the scheduler's per-request
``EngineCoreOutput``, the future a launched step returns, and what users get
(vLLM's ``RequestOutput``, ``CompletionOutput`` and ``Logprob``).

These types cross the boundaries between workers, executor, scheduler, engine and
front ends, so they sit at the bottom of the package graph next to
``minivllm/request.py``; vLLM's user-facing import path works too:
``from minivllm.outputs import RequestOutput, CompletionOutput, PoolingRequestOutput``
(what ``LLM.encode`` / ``LLM.embed`` return: ``PoolingRequestOutput``, ``EmbeddingRequestOutput``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch

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
class KVConnectorOutput:
    """What a KV connector's worker half reports after a step (``minivllm/kv_transfer/``)."""

    finished_loading: set[RequestId] = field(default_factory=set)
    """Requests whose blocks loaded in this step are in the cache."""
    finished_saving: set[RequestId] = field(default_factory=set)
    """Requests whose blocks saved in this step are held outside (or ordered before any reuse)."""
    invalid_block_ids: set[int] = field(default_factory=set)
    """Blocks whose load failed on some rank (vLLM's ``get_block_ids_with_load_errors``):
    their KV is not there; the scheduler rolls their requests back and recomputes."""


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
    kv_connector_output: KVConnectorOutput | None = None
    """With a KV connector: the step's finished transfers; None otherwise."""


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
    """Prompt tokens whose KV was not computed when the request was first scheduled (prefix-cache
    hits and tokens loaded through a KV connector)."""
    pooling_output: Any = None
    """runner=pooling: the request's pooled (H,) tensor, with its one placeholder token."""
    kv_transfer_params: dict[str, Any] | None = None
    """With a finished request's last output: where a KV connector holds its prompt's KV for
    another engine (a ``kv_producer``'s; None otherwise)."""


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


class Logprob(float):
    """One token's log-probability with its rank and text (vLLM's fields):
    ``Logprob(logprob, rank=None, decoded_token=None)``.

    A ``float`` subclass: ``lp[token].logprob`` reads as in vLLM, and code that
    treats the entry as a number (sums, comparisons, JSON) keeps working.
    ``rank`` is the token's 1-based position in the vocabulary sorted by
    probability (ties share the better rank), also for a sampled or prompt token
    outside the requested top-k: the worker counts the tokens more likely than it.
    """

    def __new__(cls, logprob: float, rank: int | None = None, decoded_token: str | None = None) -> "Logprob":
        obj = super().__new__(cls, logprob)
        obj.rank = rank
        obj.decoded_token = decoded_token
        return obj

    @property
    def logprob(self) -> float:
        return float(self)

    def __reduce__(self):
        return (Logprob, (float(self), self.rank, self.decoded_token))

    def __repr__(self) -> str:
        return f"Logprob(logprob={float(self)!r}, rank={self.rank!r}, decoded_token={self.decoded_token!r})"


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
    """Prompt tokens whose KV was not computed when the request was first scheduled: found in
    the device's prefix cache, or loaded through a KV connector (host memory, another engine)."""
    kv_transfer_params: dict[str, Any] | None = None
    """Finished, on a ``kv_producer`` whose connector holds the prompt's KV for another engine:
    where it is (pass it as ``SamplingParams.extra_args["kv_transfer_params"]`` there)."""


# ---- what LLM.encode / LLM.embed return (vLLM's classes and fields) ----


@dataclass
class PoolingOutput:
    data: torch.Tensor
    """(H,) or (dimensions,) fp32: the pooled (and finished) vector."""


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class PoolingRequestOutput:
    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool = True
    num_cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache."""


@dataclass
class EmbeddingRequestOutput:
    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True

    @classmethod
    def from_base(cls, out: PoolingRequestOutput) -> "EmbeddingRequestOutput":
        return cls(out.request_id, EmbeddingOutput(out.outputs.data.tolist()), out.prompt_token_ids, out.finished)
