"""What the scheduler decides for one step (``StepPlan``) and hands the executor (``SchedulerOutput``).

New requests travel in full; requests the workers have already seen travel as
deltas (new tokens and new blocks), so a step's message stays small as
sequences grow. Workers keep per-request state between steps. What comes back
is in ``minivllm/outputs.py``.

The builders at the end read requests and change nothing: the scheduler builds
the output from its plan *before* it counts the step's tokens as computed, so the
workers see each request as it was when the step was planned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from minivllm.core.block_pool import BlockId
from minivllm.core.encoder_scheduling import EncoderStep
from minivllm.kv_transfer.connector import KVConnectorMetadata
from minivllm.lora_request import LoRARequest
from minivllm.multimodal.feature import MultiModalFeature
from minivllm.request import Request, RequestId
from minivllm.sampling_params import SamplingParams


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
    mm_features: list[MultiModalFeature] = field(default_factory=list)
    """The prompt's images (their processed tensors travel once, with the request)."""
    state_slot: int | None = None
    """Hybrid models: the request's slot in the linear-attention layers' states (the KV-cache
    manager's, held until it finishes or is preempted); None for other models."""


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
    forget_req_ids: set[RequestId] = field(default_factory=set)
    """Requests the workers drop all state of: finished, aborted *or preempted* since the
    last step (a preempted request comes back later in ``new_reqs``, in full)."""
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
    scheduled_encoder_inputs: dict[RequestId, list[int]] = field(default_factory=dict)
    """Images whose vision encoder runs in this step: request -> indices into its ``mm_features``
    (the step's tokens reach their placeholders, and their features are not cached yet)."""
    free_encoder_input_ids: list[str] = field(default_factory=list)
    """Identifiers (``MultiModalFeature.identifier``) of encoder outputs the workers may drop: no
    request needs them any more (placeholders all computed, or finished or preempted). Applied
    before this step's encoder inputs run."""
    kv_connector_metadata: KVConnectorMetadata | None = None
    """A KV connector's loads (before the forward) and saves (after it) for this step; None
    when there is no connector or nothing to move (``minivllm/kv_transfer/connector.py``)."""
    num_steps: int = 1
    """Decode steps the workers run back to back (``scheduler.num_scheduler_steps``): above 1
    only when every scheduled request decodes one token; each then samples ``num_steps``
    tokens, the later steps fed the earlier ones' tokens on the device, into KV slots the
    scheduler allocated ahead."""

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


@dataclass
class StepPlan:
    """Decisions of one ``schedule()`` call, turned into a SchedulerOutput at the end."""

    budget: int
    max_reqs: int
    """Most requests in this batch (micro-batching: one slot's share; else max_num_seqs)."""
    scheduled: dict[RequestId, int] = field(default_factory=dict)
    new_blocks: dict[RequestId, list[BlockId]] = field(default_factory=dict)
    """Running requests' blocks allocated in this step (absent: none)."""
    spec_tokens: dict[RequestId, list[int]] = field(default_factory=dict)
    continuing: list[Request] = field(default_factory=list)
    """Running requests scheduled in this step, in ``scheduled`` order."""
    newly_admitted: list[Request] = field(default_factory=list)
    preempted: bool = False
    num_steps: int = 1
    """Decode steps this batch runs (``SchedulerOutput.num_steps``), chosen before any request is
    scheduled (``Scheduler._decode_steps``: the slots of all of them fit in the free blocks)."""
    encoder: EncoderStep | None = None
    """Images encoded in this step, and the encoder budget left."""


def cached_request_data(plan: StepPlan, send_token_ids: bool) -> CachedRequestData:
    """The deltas of the running requests the plan continues (``send_token_ids``:
    pipeline parallelism, whose first stages learn sampled tokens from here)."""
    scheduled, new_blocks, continuing = plan.scheduled, plan.new_blocks, plan.continuing
    req_ids = [r.request_id for r in continuing]
    return CachedRequestData(
        req_ids=req_ids,
        new_block_ids=[new_blocks.get(i) for i in req_ids] if new_blocks else [None] * len(req_ids),
        num_computed_tokens=[r.num_computed_tokens for r in continuing],
        new_token_ids=[output_tokens_in(r, scheduled[r.request_id]) for r in continuing] if send_token_ids else [],
    )


def new_request_data(request: Request, block_ids: list[BlockId], state_slot: int | None = None) -> NewRequestData:
    """A request admitted in this step, in full (``block_ids``: its whole block table;
    ``state_slot``: its linear-attention state slot, hybrid models only)."""
    return NewRequestData(
        req_id=request.request_id,
        token_ids=request.all_token_ids,
        num_prompt_tokens=request.num_prompt_tokens,
        sampling_params=request.sampling_params,
        block_ids=block_ids,
        num_computed_tokens=request.num_computed_tokens,
        lora_request=request.lora_request,
        mm_features=request.mm_features,
        state_slot=state_slot,
    )


def output_tokens_in(request: Request, num_new: int) -> list[int]:
    """The output tokens among a request's next ``num_new`` inputs (from ``num_computed_tokens``)."""
    start = request.num_computed_tokens - request.num_prompt_tokens
    return request.output_token_ids[max(start, 0) : start + num_new] if start + num_new > 0 else []
