"""The runner's per-request state, brought up to date with one scheduler output.

``update_states`` is the first thing a step does on the worker, before any input
is built, and the only place where requests enter or leave the worker's
per-request stores: the persistent batch (``input_batch.py``) and, where on, the
prompt-logprob requests, the images (``mm_runner.py``), the LoRA adapter of each
request and its M-RoPE positions. In order:

1. Sampled tokens of earlier steps are stored in their rows while every row still
   holds the request that sampled them.
2. Encoder outputs no request needs any more are dropped.
3. ``forget_req_ids`` (finished, aborted or preempted) leave every store before
   ``new_reqs`` enter them: a preempted request comes back as a new one, in full,
   under the same id.
4. Requests already in the batch (``cached_reqs``) take the scheduler's
   ``num_computed_tokens`` as they are (rejected drafts make it go back), lose the
   block-table entries of rolled-back drafts, then gain their new blocks; on a pipeline
   stage other than the last, the tokens the last stage sampled are written into them.
5. The batch is condensed (rows ``0 .. N-1`` full), and only then are this step's
   draft tokens written, into the rows the step will read.

Prompt logprobs are tracked only where they are computed: with pipeline stages,
on the last one.
"""

from __future__ import annotations

import numpy as np
import torch

from minivllm.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from minivllm.distributed.pipeline import PipelineStage
from minivllm.lora.manager import LoRAModelManager
from minivllm.request import RequestId
from minivllm.spec_decode.verifier import DraftVerifier
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.mm_runner import MultiModalRunner
from minivllm.worker.mrope_positions import MRopePositions
from minivllm.worker.prompt_logprobs_requests import PromptLogprobsRequests


def update_states(
    sched: SchedulerOutput,
    batch: InputBatch,
    device: torch.device,
    prompt_logprobs: PromptLogprobsRequests,
    spec: DraftVerifier | None,
    pipeline: PipelineStage | None,
    mm: MultiModalRunner | None,
    lora: LoRAModelManager | None,
    mrope: MRopePositions | None,
) -> None:
    """Fold ``sched``'s per-request deltas into ``batch`` and the optional stores (None: off)."""
    batch.store_sampled()  # the tokens of earlier steps whose outputs were taken
    if mm is not None and sched.free_encoder_input_ids:
        mm.free(sched.free_encoder_input_ids)
    for req_id in sched.forget_req_ids:
        _forget(req_id, batch, prompt_logprobs, mm, lora, mrope)
    for new in sched.new_reqs:
        _admit(new, batch, device, prompt_logprobs, pipeline, mm, lora, mrope)
    if len(sched.cached_reqs):
        _advance_cached(sched.cached_reqs, batch, spec, pipeline)
    batch.condense()
    if sched.scheduled_spec_decode_tokens:
        spec.write_drafts(batch, sched)


def _forget(
    req_id: RequestId,
    batch: InputBatch,
    prompt_logprobs: PromptLogprobsRequests,
    mm: MultiModalRunner | None,
    lora: LoRAModelManager | None,
    mrope: MRopePositions | None,
) -> None:
    batch.remove(req_id)
    prompt_logprobs.remove(req_id)
    if mm is not None:
        mm.remove_request(req_id)
    if lora is not None:
        lora.remove_request(req_id)
    if mrope is not None:
        mrope.remove(req_id)


def _admit(
    new: NewRequestData,
    batch: InputBatch,
    device: torch.device,
    prompt_logprobs: PromptLogprobsRequests,
    pipeline: PipelineStage | None,
    mm: MultiModalRunner | None,
    lora: LoRAModelManager | None,
    mrope: MRopePositions | None,
) -> None:
    batch.add(new, device)
    if mm is not None:
        mm.add_request(new)
    if pipeline is None or pipeline.is_last:  # else the last stage computes them
        prompt_logprobs.add(new)
    if lora is not None:
        lora.add_request(new.req_id, new.lora_request)
    if mrope is not None:
        mrope.add(new)


def _advance_cached(
    cached: CachedRequestData, batch: InputBatch, spec: DraftVerifier | None, pipeline: PipelineStage | None
) -> None:
    rows = batch.rows_of(cached.req_ids)
    batch.num_computed_tokens[np.asarray(rows)] = cached.num_computed_tokens
    if spec is not None:
        spec.roll_back_block_tables(batch, cached)
    if any(cached.new_block_ids):
        batch.block_table.append_rows(rows, cached.new_block_ids)
    if cached.new_token_ids and not pipeline.is_last:  # tokens the last stage sampled
        for row, computed, tokens in zip(rows, cached.num_computed_tokens, cached.new_token_ids):
            if tokens:
                batch.write_output_tokens(row, computed, tokens)
