"""The scheduler: which requests run in the next step, and how many tokens each.

vLLM-v1 style: there are no prefill and decode phases. Every request has
``num_computed_tokens``; each step gives running requests (first) and then
waiting ones a share of the token budget, so prefill chunks and decode tokens
share a batch. When the KV cache is full, the most recently admitted running
request is preempted (its blocks freed, recomputed later) and goes to the
front of the waiting queue, so it resumes before newer requests.

Who joins from the waiting queue is the ``Admission`` collaborator's decision
(``admission.py``); the scheduler builds it once and asks it once per step.

Preemption: a preempted request gives its KV blocks (and its images' encoder
outputs) back and waits to be recomputed. The victim is the last request of the
*running order*, the order running requests get budget and blocks in, so a victim,
taken from its end, is never already scheduled in the step. With
``scheduler.policy=priority`` the waiting queue and the running order are
``(priority, arrival_time)`` (lower first), and before each step the head of the
waiting queue preempts running requests of strictly lower priority until it has
a seat and blocks for its first chunk.

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
Multi-step decoding (``scheduler.num_scheduler_steps = N > 1``): when every running
request decodes one token, may run ahead (``may_run_ahead``: its sampling reads no
token history and no grammar masks it) and nobody waits to be admitted, a step runs
up to N decode steps back to back on the workers (``SchedulerOutput.num_steps``). Each
request gets KV slots for all of them now; it counts all of them as computed (and, with
async scheduling, all their tokens as placeholders), and its output brings up to N
tokens, appended up to the first that finishes it (the rest were computed and are
dropped). A step that admits, chunks a prefill or holds a request that must not run
ahead runs once; N is halved until every request's slots fit in the free blocks.
Pipeline micro-batching (``parallel.pp_microbatches > 1``): the engine core keeps
several scheduled batches in flight, one per pipeline slot. A request in a batch
that has not come back is *in flight* and is left out of later batches (running
or waiting), so the batches in flight hold disjoint requests and every batch sees
its requests' tokens complete. An in-flight request may still be preempted or
aborted: its blocks go to a later batch, which every stage runs after the one in
flight, and a token it sampled is kept (a preempted one) or dropped (an aborted one).
Each batch takes at most its share of the unfinished requests (``ceil(n / slots)``),
so that the batches in flight stay of a size and every stage has work.

After a step (``update_from_output``) the sampled tokens go into their requests
and the stop rules decide whether each request is finished (``check_stop``, a
decision without side effects, as vLLM's; the scheduler applies it: records the
stop token, finishes the request). The rules, in order: EOS (unless
``ignore_eos``) and the request's stop token ids stop it, but only from its
``min_tokens``-th output token on; reaching ``max_tokens`` ends it by length.
Stop strings are not here: they need text, which only the engine has.
"""

from __future__ import annotations

import logging

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.admission import Admission
from minivllm.core.block_hash import model_identity, root_hash
from minivllm.core.block_pool import BlockId
from minivllm.core.encoder_scheduling import EncoderCacheManager
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.request_queue import make_waiting_queue
from minivllm.core.scheduler_output import SchedulerOutput, StepPlan, cached_request_data, new_request_data
from minivllm.core.spec_decode import SpecDecodeScheduling
from minivllm.core.stats import SchedulerStats
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.kv_transfer import make_kv_connector
from minivllm.outputs import EngineCoreOutput, ModelRunnerOutput
from minivllm.request import Request, RequestId, RequestStatus
from minivllm.sample.metadata import may_run_ahead
from minivllm.structured_output.backend import backend_for
from minivllm.structured_output.manager import StructuredOutputManager

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, cfg: VllmConfig, kv_spec: KVCacheSpec) -> None:
        sched_cfg = cfg.scheduler
        self.max_num_seqs = sched_cfg.max_num_seqs
        self.max_num_batched_tokens = sched_cfg.max_num_batched_tokens
        self.policy = sched_cfg.policy
        self.async_scheduling = cfg.async_scheduling
        self.num_scheduler_steps = sched_cfg.num_scheduler_steps
        self.max_model_len = cfg.max_model_len
        self.kv = KVCacheManager(
            kv_spec.num_blocks,
            kv_spec.block_size,
            enable_caching=cfg.cache.enable_prefix_caching,
            hash_root=root_hash(model_identity(cfg)),
            sliding_window=kv_spec.sliding_window,
            num_state_slots=kv_spec.num_state_slots,
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
        self.encoder = EncoderCacheManager(
            sched_cfg.max_num_encoder_input_tokens or sched_cfg.max_num_batched_tokens,
            sched_cfg.encoder_cache_size or sched_cfg.max_num_batched_tokens,
        )
        """Images: which step runs each one's vision encoder (``encoder_scheduling.py``); idle for text."""
        self.connector = make_kv_connector(cfg, "scheduler", kv_spec) if cfg.kv_transfer.enabled else None
        """The KV connector's scheduler half (``kv_transfer``): blocks loaded at admission, saved
        after the step that computes them; None when off."""
        self.admission = Admission(
            self.waiting,
            self.running,
            self.kv,
            self.encoder,
            self.structured,
            self.in_flight,
            self.connector,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_loras=cfg.lora.max_loras if cfg.lora.enable_lora else 0,
            chunked_prefill=sched_cfg.enable_chunked_prefill,
        )
        """Which waiting requests join the running ones in a step (``admission.py``)."""

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
        """Forget every cached prefix block (the host-memory tier's too); False (nothing changed)
        while requests hold blocks."""
        done = self.kv.reset_prefix_cache()
        if done and self.connector is not None:
            self.connector.reset_cache()
        return done

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
            **(self._connector_stats() if self.connector is not None else {}),
            **(self.spec.stats.as_scheduler_stats() if self.spec is not None else {}),
        )

    def _connector_stats(self) -> dict:
        return dict(
            external_prefix_cache_queries=self.connector.num_queried_tokens,
            external_prefix_cache_hits=self.connector.num_loaded_tokens,
        )

    def _finish(self, request: Request, status: RequestStatus) -> None:
        """Out of the queues, its blocks (and images' encoder outputs) freed, forgotten by the workers."""
        request.status = status
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        if request.mm_features:
            self.encoder.free(request)
        if self.connector is not None:
            request.kv_transfer_params = self.connector.request_finished(request)
        self._forget.add(request.request_id)
        self.structured.remove(request.request_id)
        del self.requests[request.request_id]

    # ---- one step -----------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        plan = StepPlan(budget=self.max_num_batched_tokens, max_reqs=self._batch_seats())
        plan.encoder = self.encoder.new_step()
        if self.num_scheduler_steps > 1:
            plan.num_steps = self._decode_steps()
        if self.policy == "priority":
            self._preempt_for_waiting_priority()
        self._schedule_running(plan)
        if not plan.preempted:
            self.admission.admit(plan)
        sampling = self._sampling_requests(plan) if self.structured.active else None
        scheduler_output = self._make_output(plan)  # advances the requests (and adds async scheduling's placeholders)
        self._num_steps = scheduler_output.step_id = self._num_steps + 1
        if sampling is not None:
            self._attach_grammar_bitmask(scheduler_output, sampling)
        return scheduler_output

    def _decode_steps(self) -> int:
        """How many decode steps the next batch may run back to back: ``num_scheduler_steps`` when
        every running request decodes one token and may run ahead, and nobody waits to be admitted
        (a new request waits at most one multi-step batch); no more than the tokens the request
        furthest from its ``max_tokens`` still needs, nor than the context length leaves the
        nearest to it (its last token must fit in ``max_model_len``), and halved until every
        request's slots for them fit in the free blocks (a multi-step batch never preempts for
        slots a one-step batch would not need). Otherwise 1."""
        if self.waiting or self.structured.active or not self.running:
            return 1
        steps, needed = self.num_scheduler_steps, 0
        for request in self.running:
            pending = request.num_output_placeholders
            if request.num_tokens + pending - request.num_computed_tokens != 1:
                return 1  # a prefill chunk left
            if not may_run_ahead(request.sampling_params):
                return 1
            steps = min(steps, self.max_model_len - request.num_computed_tokens - 1)
            needed = max(needed, request.max_tokens - request.num_output_tokens - pending)
        steps = min(steps, needed)
        grow, free = self.kv.blocks_to_grow, self.kv.num_free_blocks
        while steps > 1 and sum(grow(request, steps) for request in self.running) > free:
            steps //= 2
        return max(1, steps)

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

    def _attach_grammar_bitmask(self, scheduler_output: SchedulerOutput, sampling: list[Request]) -> None:
        """Bitmask rows for the requests that sample in this step."""
        filled = self.structured.fill_bitmask(sampling)
        if filled is not None:
            scheduler_output.grammar_bitmask, scheduler_output.structured_output_request_ids = filled

    def _schedule_running(self, plan: StepPlan) -> None:
        """Running requests first: their decodes and unfinished prefill chunks go
        before any new prompt. This loop runs once per running request per step, so
        it reads the request's fields directly and asks the KV-cache manager for
        blocks only when its table cannot hold the new tokens."""
        has_room, scheduled, new_blocks_of = self.kv.has_room, plan.scheduled, plan.new_blocks
        running, in_flight, spec, continuing = RequestStatus.RUNNING, self.in_flight, self.spec, plan.continuing
        budget, seats, steps = plan.budget, plan.max_reqs - len(scheduled), plan.num_steps
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
            elif steps > 1:  # a decode (num_new == 1): a slot for each step's token; they fit (``_decode_steps``)
                num_slots = steps
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

    # ---- preemption -----------------------------------------------------------------
    def _running_order(self) -> list[Request]:
        """The order running requests get budget and blocks in; preemption victims
        are taken from its end, so they are never already scheduled."""
        if self.policy == "priority":
            index = {id(r): i for i, r in enumerate(self.running)}
            return sorted(self.running, key=lambda r: (r.priority, r.arrival_time, index[id(r)]))
        return list(self.running)

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
        while self.running and not self.admission.could_admit(head):
            victim = self._running_order()[-1]
            if victim.priority <= head.priority:
                return
            self._preempt(victim)

    def _preempt(self, request: Request) -> None:
        """Take a running request back to the front of the waiting queue, its blocks (and
        images' encoder outputs) freed and its tokens to be computed again."""
        self._requeue(request)
        request.num_preemptions += 1
        self.num_preemptions += 1
        if self.num_preemptions == 1:
            logger.warning(
                "Request %s was preempted: the KV cache is full. Preempted requests are recomputed later, "
                "which costs time; give the cache more memory (cache.gpu_memory_utilization, "
                "cache.cpu_memory_gb) or lower scheduler.max_num_seqs.",
                request.request_id,
            )

    def _requeue(self, request: Request) -> None:
        """A running request back at the front of the waiting queue, its blocks freed (those
        in the prefix cache stay there), forgotten by the workers until readmitted."""
        self.running.remove(request)
        self.kv.free(request)
        if request.mm_features:
            self.encoder.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self.waiting.appendleft(request)
        self._forget.add(request.request_id)

    def _recover_failed_loads(self, scheduler_output: SchedulerOutput, output: ModelRunnerOutput) -> None:
        """Some blocks a KV connector was to load in this step are not there (``invalid_block_ids``):
        every request holding one (the loading one, and any that hit it in the prefix cache in
        the same step) loses what this step sampled for it, its blocks from the first invalid
        one on leave the prefix cache, and it goes back to the waiting queue. Readmitted (after
        the outputs of steps still in flight for it, with async scheduling, came back and were
        dropped), it finds its good blocks in the device's cache and computes the rest. A request whose own load failed loads
        nothing more through the connector."""
        invalid = output.kv_connector_output.invalid_block_ids
        loads = scheduler_output.kv_connector_metadata.loads if scheduler_output.kv_connector_metadata else {}
        bs = self.kv.block_size
        for request in reversed(self.running[:]):  # requeued at the front in their order
            req_id = request.request_id
            table = self.kv.block_ids(req_id)
            first = next((i for i, b in enumerate(table) if b in invalid), None)
            if first is None:
                continue
            if output.sampled_token_ids.pop(req_id, None) is not None:
                request.num_output_placeholders -= scheduler_output.num_steps if self.async_scheduling else 0
            for per_request in (output.logprobs, output.spec_token_ids):
                if per_request:
                    per_request.pop(req_id, None)
            if req_id in loads:
                self.connector.load_failed(request, sum(bs for b, _ in loads[req_id] if b in invalid))
            logger.warning("Request %s: KV of its tokens from %d on did not load; recomputing them", req_id, first * bs)
            self.kv.uncache(request, first)
            request.num_cached_tokens = None  # counted again when readmitted
            # Outputs of steps in flight are stale; readmitted once they are back (their placeholders gone).
            request.added_after_step = request.rolled_back_after_step = self._num_steps
            self._requeue(request)

    # ---- the step's output ----------------------------------------------------------
    def _make_output(self, plan: StepPlan) -> SchedulerOutput:
        connector_meta = None
        if self.connector is not None:  # before the requests advance
            requests = (*plan.continuing, *plan.newly_admitted)
            connector_meta = self.connector.build_connector_meta(requests, plan.scheduled, self.kv.block_ids)
        scheduler_output = SchedulerOutput(
            new_reqs=[
                new_request_data(r, self.kv.block_ids(r.request_id), self.kv.state_slot(r.request_id))
                for r in plan.newly_admitted
            ],
            cached_reqs=cached_request_data(plan, self.send_token_ids),
            num_scheduled_tokens=plan.scheduled,
            forget_req_ids=self._forget,
            scheduled_spec_decode_tokens=plan.spec_tokens,
            scheduled_encoder_inputs=plan.encoder.inputs,
            free_encoder_input_ids=self.encoder.take_freed(),
            kv_connector_metadata=connector_meta,
            num_steps=plan.num_steps,
        )
        self._forget = set()
        self._advance(plan.continuing, plan.scheduled, plan.num_steps)
        self._advance(plan.newly_admitted, plan.scheduled)
        if self.encoder.held:  # images whose placeholders all have KV now: freed with the next step
            for request in (*plan.continuing, *plan.newly_admitted):
                if request.mm_features:
                    self.encoder.free_consumed(request)
        if self.in_flight is not None:
            self.in_flight.update(plan.scheduled)
        return scheduler_output

    def _advance(self, requests: list[Request], scheduled: dict[RequestId, int], steps: int = 1) -> None:
        """Count the scheduled tokens as computed; with async scheduling a request
        whose step samples gets a placeholder for that token. A batch of ``steps`` decode
        steps computes each request's token and the ``steps - 1`` it samples before its last,
        and samples ``steps`` tokens."""
        placeholder, more = self.async_scheduling, steps - 1
        for request in requests:
            computed = request.num_computed_tokens + scheduled[request.request_id]
            request.num_computed_tokens = computed + more
            if placeholder:
                pending = request.num_output_placeholders
                if computed == len(request.prompt_token_ids) + len(request.output_token_ids) + pending:
                    request.num_output_placeholders = pending + steps  # it samples in this step

    # ---- after the step -------------------------------------------------------------
    def update_from_output(
        self, scheduler_output: SchedulerOutput, output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        """A step's sampled tokens into its requests; runs once per step, after the workers return.

        For each request that sampled it appends the new tokens (with speculative
        decoding: the accepted drafts, then the target's own token; with multi-step
        decoding: one token per step) up to the first
        one that finishes the request, runs the stop checks (``check_stop``: EOS
        unless ignored, stop token ids, ``max_tokens``; ``min_tokens`` holds the first
        two back) and advances a structured-output grammar, and reports the tokens as
        ``EngineCoreOutput``s.

        Async scheduling: the step being processed may be one behind the schedule. A
        request that sampled in step k had a placeholder for that token
        (``Request.num_output_placeholders``); the real token replaces it here and the
        stop checks run as usual. A request that finished in step k may also be in step
        k+1: it was finished and forgotten when step k's output was processed, so its
        step-k+1 token finds no request and is dropped, and the output is exactly the
        synchronous one. A new request that reuses the id meanwhile was added after
        step k+1 was scheduled (``Request.added_after_step`` against
        ``SchedulerOutput.step_id``), so the stale token is dropped for it too (the same
        holds for micro-batches in flight).

        A final-only request (``Request.final_output_only``) is reported with its first
        token and when it finishes; the tokens in between travel with the last output.
        """
        results = []
        num_generated = 0
        requests, logprobs, prompt_logprobs = self.requests, output.logprobs, output.prompt_logprobs
        pooler_output = output.pooler_output
        placeholder = scheduler_output.num_steps if self.async_scheduling else 0
        grammar, spec = self.structured.active, self.spec
        if spec is not None:
            spec.receive(output.spec_token_ids)
        if output.kv_connector_output is not None:
            self.connector.update_connector_output(output.kv_connector_output)
            if output.kv_connector_output.invalid_block_ids:
                self._recover_failed_loads(scheduler_output, output)
        if self.in_flight is not None:
            self.in_flight.difference_update(scheduler_output.num_scheduled_tokens)
        step_id = scheduler_output.step_id if scheduler_output.step_id is not None else self._num_steps + 1
        for req_id, new_tokens in output.sampled_token_ids.items():
            request = requests.get(req_id)
            if request is None or request.added_after_step >= step_id:
                if request is not None and request.rolled_back_after_step >= step_id:
                    request.num_output_placeholders -= placeholder  # a stale step's token: it is recomputed
                continue  # finished or aborted meanwhile (its id may be a newer request's now)
            if placeholder:
                request.num_output_placeholders -= placeholder
            if len(new_tokens) == 1:  # a decode step: one token, appended whether or not it stops
                appended, token, output_ids = new_tokens, new_tokens[0], request.output_token_ids
                output_ids.append(token)
                # Most tokens cannot stop their request: no length reached, not EOS, no stop ids
                # (a cheap superset of check_stop's conditions; min_tokens is left to it).
                stoppable = (
                    len(output_ids) >= request.max_tokens
                    or token == request.eos_token_id
                    or request.sampling_params.stop_token_ids
                )
                finished = bool(stoppable) and self._stops(request, token)
                if grammar and not finished:
                    finished = self._check_grammar_end(request)
            else:
                appended, finished = self._append_output(request, new_tokens, grammar)
            num_generated += len(appended)
            if spec is not None:
                drafts = scheduler_output.scheduled_spec_decode_tokens.get(req_id)
                if drafts:
                    spec.after_step(self.kv, request, len(drafts), len(new_tokens))
            if request.final_output_only:
                if request.num_reported_tokens and not finished:
                    continue  # nobody reads it before the end
                appended = request.output_token_ids[request.num_reported_tokens :]
            request.num_reported_tokens += len(appended)
            results.append(
                EngineCoreOutput(
                    req_id,
                    appended,
                    logprobs[req_id][: len(appended)] if logprobs and req_id in logprobs else None,
                    request.status.finish_reason if finished else None,
                    request.stop_reason,
                    prompt_logprobs.get(req_id) if prompt_logprobs else None,
                    request.num_cached_tokens or 0,
                    pooler_output.get(req_id) if pooler_output else None,
                    request.kv_transfer_params if finished else None,
                )
            )
        self.num_generated_tokens += num_generated
        return results

    def _append_output(self, request: Request, new_tokens: list[int], grammar: bool) -> tuple[list[int], bool]:
        """Append sampled tokens up to the first that finishes the request; returns those
        appended and whether the request finished."""
        appended = []
        for token in new_tokens:
            request.output_token_ids.append(token)
            appended.append(token)
            if self._stops(request, token) or (grammar and self._check_grammar_end(request)):
                return appended, True
        return appended, False

    def _stops(self, request: Request, token: int) -> bool:
        """Whether ``token``, the request's newest output, finishes it (``check_stop``);
        if it does, the request is finished here."""
        status = check_stop(request, token)
        if status is None:
            return False
        if status is RequestStatus.FINISHED_STOPPED:
            request.stop_reason = stop_reason(request, token)
        self._finish(request, status)
        return True

    def _check_grammar_end(self, request: Request) -> bool:
        """Advance the request's matcher; a grammar that reached its end finishes it ("stop"),
        one that failed to compile aborts it."""
        if self.structured.active and self.structured.accept_tokens(request):
            failed = self.structured.failed(request)
            self._finish(request, RequestStatus.FINISHED_ABORTED if failed else RequestStatus.FINISHED_STOPPED)
            return True
        return False


def check_stop(request: Request, token: int) -> RequestStatus | None:
    """How ``token``, just appended as the request's last output token, finishes it:
    ``FINISHED_STOPPED``, ``FINISHED_LENGTH``, or None when the request goes on."""
    params = request.sampling_params
    num_output_tokens = len(request.output_token_ids)
    if num_output_tokens >= params.min_tokens:
        if _is_eos(request, token) or token in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
    if num_output_tokens >= request.max_tokens:
        return RequestStatus.FINISHED_LENGTH
    return None


def stop_reason(request: Request, token: int) -> int | None:
    """What a request that ``check_stop`` stopped at ``token`` reports as its
    ``stop_reason``: the stop token id, or None for EOS."""
    return None if _is_eos(request, token) else token


def _is_eos(request: Request, token: int) -> bool:
    return token == request.eos_token_id and not request.sampling_params.ignore_eos
