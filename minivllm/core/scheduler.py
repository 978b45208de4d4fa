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
dropped (``update_from_output`` says how, and why the output is exactly the
synchronous one). A request whose known plus pending outputs already reach ``max_tokens`` is not scheduled
again (it cannot need another step). A preempted request keeps its pending
token (it was sampled from complete KV) and is not readmitted while one is
pending. Prefix-cache hashes cover known tokens only.

Speculative decoding (``speculative.method``, ``spec_decode.py``):
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

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.admission import AdmissionLimits, admit_waiting
from minivllm.core.block_hash import model_identity, root_hash
from minivllm.core.block_pool import BlockId
from minivllm.core.encoder_scheduling import EncoderCacheManager
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.preemption import evict, priority_victim, running_order, warn_first_preemption
from minivllm.core.request_queue import make_waiting_queue
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.spec_decode import SpecDecodeScheduling
from minivllm.core.stats import SchedulerStats
from minivllm.core.step_plan import StepPlan, cached_request_data, new_request_data
from minivllm.core.step_results import StepResults
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.request import Request, RequestId, RequestStatus
from minivllm.structured_output.backend import backend_for
from minivllm.structured_output.manager import StructuredOutputManager


class Scheduler(StepResults):
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
        sched = cfg.scheduler
        self.encoder = EncoderCacheManager(
            sched.max_num_encoder_input_tokens or sched.max_num_batched_tokens,
            sched.encoder_cache_size or sched.max_num_batched_tokens,
        )
        """Images: which step runs each one's vision encoder (``encoder_scheduling.py``); idle for text."""
        self.limits = AdmissionLimits(
            self.max_num_seqs, self.max_num_batched_tokens, self.max_loras, self.chunked_prefill
        )
        """What bounds admission (``admission.py``)."""

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

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block; False (nothing changed) while requests hold blocks."""
        return self.kv.reset_prefix_cache()

    @property
    def has_grammars(self) -> bool:
        """Whether a request with structured outputs is in (its masks need every token so far)."""
        return self.structured.active

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_preemptions=self.num_preemptions,
            kv_cache_usage=self.kv.usage,
            num_free_blocks=self.kv.num_free_blocks,
            num_blocks=self.kv.num_blocks,
            num_preempted=sum(1 for r in self.waiting if r.num_preemptions > 0),
            prefix_cache_queries=self.kv.prefix_cache_stats.queries,
            prefix_cache_hits=self.kv.prefix_cache_stats.hits,
            **(self.spec.stats.as_scheduler_stats() if self.spec is not None else {}),
        )

    # ---- one step -----------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        plan = StepPlan(budget=self.max_num_batched_tokens, max_reqs=self._batch_seats())
        plan.encoder = self.encoder.new_step()
        if self.policy == "priority":
            self._preempt_for_waiting_priority()
        self._schedule_running(plan)
        if not plan.preempted:
            self._schedule_waiting(plan)
        sampling = self._sampling_requests(plan) if self.structured.active else None
        out = self._make_output(plan)  # advances the requests (and adds async scheduling's placeholders)
        self._num_steps = out.step_id = self._num_steps + 1
        if sampling is not None:
            self._attach_grammar_bitmask(out, sampling)
        return out

    def _batch_seats(self) -> int:
        if self.in_flight is None:
            return self.max_num_seqs
        return max(1, -(-self.num_unfinished_requests // self.num_microbatches))

    def _sampling_requests(self, plan: StepPlan) -> list[Request]:
        """The requests that sample in this step: their scheduled tokens reach the end of what they
        know (pending tokens included). Read before the step advances them: afterwards async
        scheduling has counted the step's own token as a placeholder, and none would match."""
        requests = self.requests
        sampling = []
        for req_id, num_new in plan.scheduled.items():
            r = requests[req_id]
            if r.num_computed_tokens + num_new == r.num_tokens + r.num_output_placeholders:
                sampling.append(r)
        return sampling

    def _attach_grammar_bitmask(self, out: SchedulerOutput, sampling: list[Request]) -> None:
        """Bitmask rows for the requests that sample in this step."""
        filled = self.structured.fill_bitmask(sampling)
        if filled is not None:
            out.grammar_bitmask, out.structured_output_request_ids = filled

    def _running_order(self) -> list[Request]:
        return running_order(self.running, self.policy)

    def _schedule_running(self, plan: StepPlan) -> None:
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
            if request.mm_features:  # stop before an image that cannot be encoded in this step
                num_new = self.encoder.fit(request, request.num_computed_tokens, num_new, plan.encoder)
                if not num_new:
                    continue
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
            if request.mm_features:
                self.encoder.commit(request, plan.encoder, request.num_computed_tokens, num_new)
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

    def _allocate_or_preempt(self, request: Request, num_new: int, plan: StepPlan) -> list[BlockId] | None:
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
        while (victim := priority_victim(head, self.running, self.kv, self.limits)) is not None:
            self._preempt(victim)

    def _schedule_waiting(self, plan: StepPlan) -> None:
        admit_waiting(
            plan, self.waiting, self.running, self.kv, self.encoder, self.structured, self.in_flight, self.limits
        )

    def _preempt(self, request: Request) -> None:
        evict(request, self.running, self.waiting, self.kv, self.encoder)
        self.num_preemptions += 1
        if self.num_preemptions == 1:
            warn_first_preemption(request)
        self._forget.add(request.request_id)

    def _make_output(self, plan: StepPlan) -> SchedulerOutput:
        out = SchedulerOutput(
            new_reqs=[new_request_data(r, self.kv.block_ids(r.request_id)) for r in plan.newly_admitted],
            cached_reqs=cached_request_data(plan, self.send_token_ids),
            num_scheduled_tokens=plan.scheduled,
            forget_req_ids=self._forget,
            scheduled_spec_decode_tokens=plan.spec_tokens,
            scheduled_encoder_inputs=plan.encoder.inputs,
            free_encoder_input_ids=self.encoder.take_freed(),
        )
        self._forget = set()
        self._advance(plan.continuing, plan.scheduled)
        self._advance(plan.newly_admitted, plan.scheduled)
        if self.encoder.held:  # images whose placeholders all have KV now: freed with the next step
            for request in (*plan.continuing, *plan.newly_admitted):
                if request.mm_features:
                    self.encoder.free_consumed(request)
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

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        if request.mm_features:
            self.encoder.free(request)
        self._forget.add(request.request_id)
        self.structured.remove(request.request_id)
        del self.requests[request.request_id]
