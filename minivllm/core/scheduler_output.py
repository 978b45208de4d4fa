"""What the scheduler hands the executor for one step.

New requests travel in full; requests the workers have already seen travel as
deltas (new tokens and new blocks), so a step's message stays small as
sequences grow. Workers keep per-request state between steps.

What comes back: the workers' ``ModelRunnerOutput`` (sampled tokens, logprobs,
drafts, pooled vectors), and per request the ``EngineCoreOutput`` the scheduler
hands the engine after its stop checks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from minivllm.core.block_pool import BlockId
from minivllm.engine.request import RequestId
from minivllm.lora.request import LoRARequest
from minivllm.sampling_params import SamplingParams


class PositionLogprobs(NamedTuple):
    """One position's logprobs as a worker sends them (the front end wraps them in ``Logprob``)."""

    token_logprobs: dict[int, float]
    """The chosen (or prompt) token first, then the top-k asked for in descending
    order; a token that is both appears once."""
    rank: int
    """The chosen token's 1-based rank in the whole vocabulary: one more than the
    number of tokens strictly more likely."""


@dataclass(slots=True)
class NewRequestData:
    req_id: RequestId
    token_ids: list[int]
    """Prompt plus any output generated before a preemption (all known tokens)."""
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[BlockId]
    num_computed_tokens: int
    lora_request: LoRARequest | None = None


@dataclass(slots=True)
class CachedRequestData:
    """Requests the workers already hold, as parallel lists (entry ``i`` is ``req_ids[i]``'s).

    No token ids travel: a worker appends the tokens it samples to its own
    copy of each request, so the scheduler only sends what it decided.
    """

    req_ids: list[RequestId] = field(default_factory=list)
    new_block_ids: list[list[BlockId] | None] = field(default_factory=list)
    """Blocks allocated since the request was last scheduled (None: none)."""
    num_computed_tokens: list[int] = field(default_factory=list)
    """Tokens with KV in the cache before this step."""
    new_token_ids: list[list[int]] = field(default_factory=list)
    """Pipeline parallelism only (else empty): the output tokens among this step's inputs
    (positions ``max(num_computed_tokens, prompt length)`` on). Only the last stage samples;
    the other stages learn its tokens here, when the request is next scheduled."""

    def __len__(self) -> int:
        return len(self.req_ids)


@dataclass
class SchedulerOutput:
    new_reqs: list[NewRequestData] = field(default_factory=list)
    cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[RequestId, int] = field(default_factory=dict)
    """New tokens per request in this step, in batch order."""
    finished_req_ids: set[RequestId] = field(default_factory=set)
    """Requests the workers can forget (finished, aborted or preempted since last step)."""
    grammar_bitmask: np.ndarray | None = None
    """Structured outputs: (rows, ceil(vocab / 32)) int32 allowed-token bits, one row per
    request in ``structured_output_request_ids``; None when no sampling request has a grammar."""
    structured_output_request_ids: list[RequestId] = field(default_factory=list)
    """The request of each ``grammar_bitmask`` row."""
    scheduled_spec_decode_tokens: dict[RequestId, list[int]] = field(default_factory=dict)
    """Speculative decoding: the draft tokens of each request that has some; they are the
    last ``len(drafts)`` of its ``num_scheduled_tokens`` (after its last known token)."""
    step_id: int | None = None
    """The scheduler's count of ``schedule()`` calls when it built this step (None: built
    elsewhere). Its tokens go only to requests added before it."""

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


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
