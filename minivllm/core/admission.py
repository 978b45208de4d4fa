"""Admission: which waiting requests join the running ones in this step.

After the running requests have had their share of the step, the head of the
waiting queue is admitted while the step has token budget, a seat and KV blocks
for its first chunk. An admitted request starts at the end of its longest cached
prefix (``num_computed_tokens > 0`` with prefix caching), and, with a KV connector
(``kv_transfer``), past the blocks after that prefix the connector can load: they take
blocks but no budget, and the connector is told their blocks once they are allocated
(``minivllm/kv_transfer/connector.py``). Its first chunk is the rest of its tokens, cut to the budget when ``chunked_prefill`` is on (without it,
a prompt that does not fit whole waits for a later step).

The head is never skipped for a later request, with two exceptions that step
aside and keep their places: a request whose grammar is still compiling, and one
whose LoRA adapter finds every adapter slot of the step taken. A preempted
request with a token (or its micro-batch) still in flight is readmitted only
once that is back. With images, a chunk stops before an image that the step's
encoder budget or the encoder cache cannot take (``encoder_scheduling.py``).
"""

from __future__ import annotations

from minivllm.core.encoder_scheduling import EncoderCacheManager
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.request_queue import FairRequestQueue
from minivllm.core.scheduler_output import StepPlan
from minivllm.kv_transfer.connector import KVConnector
from minivllm.request import Request, RequestId, RequestStatus
from minivllm.structured_output.manager import StructuredOutputManager


class Admission:
    """Admits waiting requests into a step. The scheduler builds it once with the queues
    and managers they share (the same objects: what it admits shows in the scheduler's
    ``running`` at once), asks it to ``admit`` once per step, and asks ``could_admit``
    before a priority preemption."""

    def __init__(
        self,
        waiting: FairRequestQueue,
        running: list[Request],
        kv: KVCacheManager,
        encoder: EncoderCacheManager,
        structured: StructuredOutputManager,
        in_flight: set[RequestId] | None,
        connector: KVConnector | None,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_loras: int,
        chunked_prefill: bool,
    ) -> None:
        self.waiting = waiting
        self.running = running
        self.kv = kv
        self.encoder = encoder
        self.structured = structured
        self.in_flight = in_flight
        """Micro-batching: requests in a batch whose output has not come back (None when off)."""
        self.connector = connector
        """A KV connector's scheduler half: blocks past the device's hits loaded from it (None when off)."""
        self.max_num_seqs = max_num_seqs
        """Most running requests."""
        self.max_num_batched_tokens = max_num_batched_tokens
        """A step's token budget."""
        self.max_loras = max_loras
        """Most distinct LoRA adapters among the running requests (0: LoRA off)."""
        self.chunked_prefill = chunked_prefill
        """Whether a prompt may be admitted with a first chunk shorter than the rest of it."""

    def admit(self, plan: StepPlan) -> None:
        """Move requests from the head of the waiting queue to the running ones, scheduling
        each one's first chunk in ``plan`` (its budget shrinks; ``newly_admitted`` grows)."""
        waiting, running, kv, encoder, structured = self.waiting, self.running, self.kv, self.encoder, self.structured
        if not waiting:
            return
        in_flight, chunked_prefill, connector = self.in_flight, self.chunked_prefill, self.connector
        set_aside: list[Request] = []
        adapters = {r.lora_int_id for r in running} - {None} if self.max_loras else set()
        while waiting and plan.budget > 0 and len(running) < self.max_num_seqs:
            if len(plan.scheduled) >= plan.max_reqs:
                break
            request = waiting[0]
            if request.num_output_placeholders or (in_flight and request.request_id in in_flight):
                break  # preempted with a token (or its batch) in flight: readmit it once that is back
            if structured.active and not structured.is_ready(request):
                set_aside.append(waiting.popleft())  # let the others by
                continue
            if request.lora_int_id is not None and request.lora_int_id not in adapters:
                if len(adapters) >= self.max_loras:
                    set_aside.append(waiting.popleft())  # its adapter waits for a free slot
                    continue
            cached = kv.get_computed_blocks(request)
            num_cached = num_device = len(cached) * kv.block_size
            if connector is not None:  # loaded tokens take blocks, not budget: computed once loaded
                num_cached += connector.get_num_new_matched_tokens(request, num_device)
            num_new = request.num_tokens - num_cached
            if num_new > plan.budget and not chunked_prefill:
                break
            num_new = min(num_new, plan.budget)
            if request.mm_features:
                fitting = encoder.fit(request, num_cached, num_new, plan.encoder)
                if not fitting or (fitting < num_new and not chunked_prefill):
                    break  # its next image waits for encoder budget or cache
                num_new = fitting
            if kv.allocate_slots(request, num_cached - num_device + num_new, cached) is None:
                break
            if connector is not None:
                connector.update_state_after_alloc(
                    request, kv.block_ids(request.request_id), num_device, num_cached - num_device
                )
            waiting.popleft()
            if request.mm_features:
                encoder.commit(request, plan.encoder, num_cached, num_new)
            if request.lora_int_id is not None:
                adapters.add(request.lora_int_id)
            self._start_running(request, num_cached)
            plan.scheduled[request.request_id] = num_new
            plan.newly_admitted.append(request)
            plan.budget -= num_new
        for request in reversed(set_aside):
            waiting.appendleft(request)

    def _start_running(self, request: Request, num_cached: int) -> None:
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_cached
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_cached
        self.running.append(request)

    def could_admit(self, request: Request) -> bool:
        """Whether ``request`` would find a seat and blocks for its first chunk now."""
        if len(self.running) >= self.max_num_seqs:
            return False
        kv = self.kv
        cached = kv.get_computed_blocks(request)
        num_device = len(cached) * kv.block_size
        num_external = self.connector.get_num_new_matched_tokens(request, num_device) if self.connector else 0
        num_new = min(request.num_tokens - num_device - num_external, self.max_num_batched_tokens)
        return kv.can_allocate(request, num_external + num_new, cached)
