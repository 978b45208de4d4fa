"""The scheduler: which requests run in the next step, and how many tokens each.

vLLM-v1 style: there are no prefill and decode phases. Every request has
``num_computed_tokens``; each step gives running requests (first) and then
waiting ones a share of the token budget, so prefill chunks and decode tokens
share a batch. When the KV cache is full, the most recently admitted running
request is preempted (its blocks freed, recomputed later) and goes to the
front of the waiting queue, so it resumes before newer requests.

With ``scheduler.policy=priority`` the waiting queue and the running requests
are ordered by ``(priority, arrival_time)`` (lower first), the victim of a
preemption is the last running request in that order, and before each step
the head of the waiting queue preempts running requests of strictly lower
priority until it has a seat and blocks for its first chunk.

With prefix caching, an admitted request starts at the end of its longest
cached prefix (``num_computed_tokens > 0``). Blocks are registered in the
cache as soon as they are scheduled, so a request admitted later in the same
step can share KV that this step computes (each attention layer writes the
whole batch's keys and values before attending). That is only sound if a
scheduled request is never taken back out of its step: running requests are
visited in victim order (victims always come later), and priority
preemptions happen before anything is scheduled.

Async scheduling (``scheduler.async_scheduling``): the engine core schedules
step k+1 before it has step k's sampled tokens, so the device never waits for
the host. What is speculative: a request that samples in step k gets a
*placeholder* for that token (``num_output_placeholders``), and step k+1
already schedules the placeholder as the request's next input (the worker fills
it in from its own sampled tokens). When step k's output arrives, the real
token replaces the placeholder, and a token of a request finished meanwhile is
dropped (``output_update.py`` says how, and why the output is exactly the
synchronous one). A request whose known plus pending outputs already reach ``max_tokens`` is not scheduled
again (it cannot need another step). A preempted request keeps its pending
token (it was sampled from complete KV) and is not readmitted while one is
pending. Prefix-cache hashes cover known tokens only.

Speculative decoding (``speculative.method``, ``spec_decode/scheduling.py``):
a decoding request may be scheduled for ``1 + k`` tokens, its last known token
and ``k`` drafts (``SchedulerOutput.scheduled_spec_decode_tokens``, from the
n-gram lookup or from the worker's draft model); after the step the rejected
drafts are rolled back. It runs without async scheduling.
Pipeline micro-batching (``parallel.pp_microbatches > 1``): the engine core keeps
several scheduled batches in flight, one per pipeline slot. A request in a batch
that has not come back is *in flight* and is left out of later batches (running
or waiting), so the batches in flight hold disjoint requests and every batch sees
its requests' tokens complete. An in-flight request may still be preempted or
aborted: its blocks go to a later batch, which every stage runs after the one in
flight, and a token it sampled is kept (a preempted one) or dropped (an aborted one).
Each batch takes at most its share of the unfinished requests (``ceil(n / slots)``),
so that the batches in flight stay of a size and every stage has work.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.block_hash import model_identity, root_hash
from minivllm.core.block_pool import BlockId
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.output_update import OutputUpdate
from minivllm.core.request_queue import make_waiting_queue
from minivllm.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from minivllm.core.stats import SchedulerStats
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.request import Request, RequestId, RequestStatus
from minivllm.spec_decode.scheduling import SpecDecodeScheduling
from minivllm.structured_output.backend import backend_for
from minivllm.structured_output.manager import StructuredOutputManager

logger = logging.getLogger(__name__)


@dataclass
class _StepPlan:
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


class Scheduler(OutputUpdate):
    def __init__(self, cfg: VllmConfig, kv_spec: KVCacheSpec) -> None:
        self.max_num_seqs = cfg.scheduler.max_num_seqs
        self.max_num_batched_tokens = cfg.scheduler.max_num_batched_tokens
        self.chunked_prefill = cfg.scheduler.enable_chunked_prefill
        self.policy = cfg.scheduler.policy
        self.async_scheduling = cfg.async_scheduling
        self.max_loras = cfg.lora.max_loras if cfg.lora.enable_lora else 0
        """Most distinct LoRA adapters among the running requests (one step's slots)."""
        self.kv = KVCacheManager(
            kv_spec.num_blocks,
            kv_spec.block_size,
            enable_caching=cfg.cache.enable_prefix_caching,
            hash_root=root_hash(model_identity(cfg)),
            sliding_window=kv_spec.sliding_window,
        )
        self.requests: dict[RequestId, Request] = {}
        self.waiting = make_waiting_queue(self.policy)
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_generated_tokens = 0
        """Output tokens sampled since the engine started (reported or not yet)."""
        self._forget: set[RequestId] = set()
        """Requests the workers should drop at the next step."""
        self._num_steps = 0
        """``schedule()`` calls so far: the last ``SchedulerOutput.step_id``."""
        self.structured = StructuredOutputManager(lambda: backend_for(cfg))
        """Grammar matchers of requests with structured outputs."""
        self.spec = SpecDecodeScheduling(cfg.speculative, cfg.max_model_len) if cfg.speculative.enabled else None
        """Draft proposals and rollback; None when speculative decoding is off."""
        self.num_microbatches = cfg.parallel.num_microbatches
        self.in_flight: set[RequestId] | None = set() if self.num_microbatches > 1 else None
        """Micro-batching: requests in a batch whose output has not come back (None when off)."""
        self.send_token_ids = cfg.parallel.pp > 1
        """Pipeline stages other than the last learn sampled tokens from the scheduler."""

    # ---- requests in and out --------------------------------------------------------
    def add_request(self, request: Request) -> None:
        request.added_after_step = self._num_steps
        self.requests[request.request_id] = request
        self.structured.add_request(request)
        self.waiting.append(request)

    def abort_requests(self, request_ids: list[RequestId]) -> None:
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is not None and not request.is_finished:
                self._finish(request, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_preemptions=self.num_preemptions,
            kv_cache_usage=self.kv.usage,
            num_free_blocks=self.kv.num_free_blocks,
            num_blocks=self.kv.pool.num_blocks,
            num_preempted=sum(1 for r in self.waiting if r.num_preemptions > 0),
            prefix_cache_queries=self.kv.prefix_cache_stats.queries,
            prefix_cache_hits=self.kv.prefix_cache_stats.hits,
            **(self.spec.stats.as_scheduler_stats() if self.spec is not None else {}),
        )

    # ---- one step -----------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        plan = _StepPlan(budget=self.max_num_batched_tokens, max_reqs=self._batch_seats())
        if self.policy == "priority":
            self._preempt_for_waiting_priority()
        self._schedule_running(plan)
        if not plan.preempted:
            self._schedule_waiting(plan)
        out = self._make_output(plan)
        self._num_steps = out.step_id = self._num_steps + 1
        if self.structured.active:
            self._attach_grammar_bitmask(out)
        return out

    def _batch_seats(self) -> int:
        if self.in_flight is None:
            return self.max_num_seqs
        return max(1, -(-self.num_unfinished_requests // self.num_microbatches))

    def _attach_grammar_bitmask(self, out: SchedulerOutput) -> None:
        """Bitmask rows for the requests that sample in this step (all their tokens computed)."""
        sampling = [self.requests[r] for r in out.num_scheduled_tokens]
        sampling = [r for r in sampling if r.num_computed_tokens == r.num_tokens + r.num_output_placeholders]
        filled = self.structured.fill_bitmask(sampling)
        if filled is not None:
            out.grammar_bitmask, out.structured_output_request_ids = filled

    def _running_order(self) -> list[Request]:
        """The order running requests get budget and blocks in; preemption victims
        are taken from its end, so they are never already scheduled."""
        if self.policy == "priority":
            index = {id(r): i for i, r in enumerate(self.running)}
            return sorted(self.running, key=lambda r: (r.priority, r.arrival_time, index[id(r)]))
        return list(self.running)

    def _schedule_running(self, plan: _StepPlan) -> None:
        """Running requests first: their decodes and unfinished prefill chunks go
        before any new prompt. This loop runs once per running request per step, so
        it reads the request's fields directly and asks the KV-cache manager for
        blocks only when its table cannot hold the new tokens."""
        has_room, scheduled, new_blocks_of = self.kv.has_room, plan.scheduled, plan.new_blocks
        running, in_flight, spec, continuing = RequestStatus.RUNNING, self.in_flight, self.spec, plan.continuing
        budget, seats = plan.budget, plan.max_reqs - len(scheduled)
        for request in self._running_order():
            if budget <= 0 or seats <= 0:
                break
            if request.status is not running:
                continue  # preempted earlier in this step
            if in_flight and request.request_id in in_flight:
                continue  # its batch has not come back
            pending = request.num_output_placeholders
            if pending and not self._may_continue(request):
                continue
            num_known = len(request.prompt_token_ids) + len(request.output_token_ids)
            num_new = num_known + pending - request.num_computed_tokens
            if num_new > budget:
                num_new = budget
            drafts, num_slots = None, num_new
            if spec is not None:
                drafts, lookahead = spec.plan(self.kv, request, num_new, budget)
                num_slots += len(drafts) + lookahead
            if not has_room(request, num_slots):
                new_blocks = self._allocate_or_preempt(request, num_slots, plan)
                if new_blocks is None:
                    continue  # the request itself was preempted
                if new_blocks:
                    new_blocks_of[request.request_id] = new_blocks
            if drafts:
                plan.spec_tokens[request.request_id] = drafts
                num_new += len(drafts)
            scheduled[request.request_id] = num_new
            continuing.append(request)
            budget -= num_new
            seats -= 1
        plan.budget = budget

    @staticmethod
    def _may_continue(request: Request) -> bool:
        """Whether a request with a pending token could still need another step."""
        return request.num_output_tokens + request.num_output_placeholders < request.max_tokens

    def _allocate_or_preempt(self, request: Request, num_new: int, plan: _StepPlan) -> list[BlockId] | None:
        """Blocks for ``num_new`` more tokens of a running request, preempting from the
        end of the running order until they fit. None when ``request`` itself went."""
        while (new_blocks := self.kv.allocate_slots(request, num_new)) is None:
            victim = self._running_order()[-1]
            if victim.request_id in plan.scheduled:
                raise RuntimeError(f"preempting {victim.request_id}, already scheduled in this step")
            self._preempt(victim)
            plan.preempted = True
            if victim is request:
                return None
        return new_blocks

    def _preempt_for_waiting_priority(self) -> None:
        """Priority policy: let running requests of strictly lower priority than the
        head of the waiting queue make room for it (a seat, blocks for its first chunk)."""
        if not self.waiting:
            return
        head = self.waiting[0]
        while self.running and not self._could_admit(head):
            victim = self._running_order()[-1]
            if victim.priority <= head.priority:
                return
            self._preempt(victim)

    def _could_admit(self, request: Request) -> bool:
        if len(self.running) >= self.max_num_seqs:
            return False
        cached = self.kv.get_computed_blocks(request)
        num_new = min(request.num_tokens - len(cached) * self.kv.block_size, self.max_num_batched_tokens)
        return self.kv.can_allocate(request, num_new, cached)

    def _schedule_waiting(self, plan: _StepPlan) -> None:
        if not self.waiting:
            return
        set_aside: list[Request] = []
        adapters = {r.lora_int_id for r in self.running} - {None} if self.max_loras else set()
        while self.waiting and plan.budget > 0 and len(self.running) < self.max_num_seqs:
            if len(plan.scheduled) >= plan.max_reqs:
                break
            request = self.waiting[0]
            if request.num_output_placeholders or (self.in_flight and request.request_id in self.in_flight):
                break  # preempted with a token (or its batch) in flight: readmit it once that is back
            if self.structured.active and not self.structured.is_ready(request):
                set_aside.append(self.waiting.popleft())  # let the others by
                continue
            if request.lora_int_id is not None and request.lora_int_id not in adapters:
                if len(adapters) >= self.max_loras:
                    set_aside.append(self.waiting.popleft())  # its adapter waits for a free slot
                    continue
            cached = self.kv.get_computed_blocks(request)
            num_cached = len(cached) * self.kv.block_size
            num_new = request.num_tokens - num_cached
            if num_new > plan.budget and not self.chunked_prefill:
                break
            num_new = min(num_new, plan.budget)
            if self.kv.allocate_slots(request, num_new, cached) is None:
                break
            self.waiting.popleft()
            if request.lora_int_id is not None:
                adapters.add(request.lora_int_id)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_cached
            if request.num_cached_tokens is None:
                request.num_cached_tokens = num_cached
            self.running.append(request)
            plan.scheduled[request.request_id] = num_new
            plan.newly_admitted.append(request)
            plan.budget -= num_new
        for request in reversed(set_aside):
            self.waiting.appendleft(request)

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        if self.num_preemptions == 1:
            logger.warning(
                "Request %s was preempted: the KV cache is full. Preempted requests are recomputed later, "
                "which costs time; give the cache more memory (cache.gpu_memory_utilization, "
                "cache.cpu_memory_gb) or lower scheduler.max_num_seqs.",
                request.request_id,
            )
        self._forget.add(request.request_id)
        self.waiting.appendleft(request)

    def _make_output(self, plan: _StepPlan) -> SchedulerOutput:
        out = SchedulerOutput(
            num_scheduled_tokens=plan.scheduled,
            finished_req_ids=self._forget,
            scheduled_spec_decode_tokens=plan.spec_tokens,
        )
        self._forget = set()
        scheduled, new_blocks, continuing = plan.scheduled, plan.new_blocks, plan.continuing
        req_ids = [r.request_id for r in continuing]
        token_ids = [_output_tokens_in(r, scheduled[r.request_id]) for r in continuing] if self.send_token_ids else []
        out.cached_reqs = CachedRequestData(
            req_ids=req_ids,
            new_block_ids=[new_blocks.get(i) for i in req_ids] if new_blocks else [None] * len(req_ids),
            num_computed_tokens=[r.num_computed_tokens for r in continuing],
            new_token_ids=token_ids,
        )
        out.new_reqs.extend(self._new_request_data(r) for r in plan.newly_admitted)
        self._advance(plan.continuing, scheduled)
        self._advance(plan.newly_admitted, scheduled)
        if self.in_flight is not None:
            self.in_flight.update(plan.scheduled)
        return out

    def _advance(self, requests: list[Request], scheduled: dict[RequestId, int]) -> None:
        """Count the scheduled tokens as computed; with async scheduling a request
        whose step samples gets a placeholder for that token."""
        placeholder = self.async_scheduling
        for request in requests:
            computed = request.num_computed_tokens = request.num_computed_tokens + scheduled[request.request_id]
            if placeholder:
                pending = request.num_output_placeholders
                if computed == len(request.prompt_token_ids) + len(request.output_token_ids) + pending:
                    request.num_output_placeholders = pending + 1  # it samples in this step

    def _new_request_data(self, request: Request) -> NewRequestData:
        return NewRequestData(
            req_id=request.request_id,
            token_ids=request.all_token_ids,
            num_prompt_tokens=request.num_prompt_tokens,
            sampling_params=request.sampling_params,
            block_ids=self.kv.block_ids(request.request_id),
            num_computed_tokens=request.num_computed_tokens,
            lora_request=request.lora_request,
        )

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        self._forget.add(request.request_id)
        self.structured.remove(request.request_id)
        del self.requests[request.request_id]


def _output_tokens_in(request: Request, num_new: int) -> list[int]:
    """The output tokens among a request's next ``num_new`` inputs (from ``num_computed_tokens``)."""
    start = request.num_computed_tokens - request.num_prompt_tokens
    return request.output_token_ids[max(start, 0) : start + num_new] if start + num_new > 0 else []
