"""What one ``schedule()`` call decided (``StepPlan``), and the parts of its
``SchedulerOutput`` that the decisions become.

The functions here read requests and change nothing: the scheduler builds the
output from them *before* it counts the step's tokens as computed, so the
workers see each request as it was when the step was planned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.core.block_pool import BlockId
from minivllm.core.encoder_scheduling import EncoderStep
from minivllm.core.scheduler_output import CachedRequestData, NewRequestData
from minivllm.request import Request, RequestId


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


def new_request_data(request: Request, block_ids: list[BlockId]) -> NewRequestData:
    """A request admitted in this step, in full (``block_ids``: its whole block table)."""
    return NewRequestData(
        req_id=request.request_id,
        token_ids=request.all_token_ids,
        num_prompt_tokens=request.num_prompt_tokens,
        sampling_params=request.sampling_params,
        block_ids=block_ids,
        num_computed_tokens=request.num_computed_tokens,
        lora_request=request.lora_request,
        mm_features=request.mm_features,
    )


def output_tokens_in(request: Request, num_new: int) -> list[int]:
    """The output tokens among a request's next ``num_new`` inputs (from ``num_computed_tokens``)."""
    start = request.num_computed_tokens - request.num_prompt_tokens
    return request.output_token_ids[max(start, 0) : start + num_new] if start + num_new > 0 else []
