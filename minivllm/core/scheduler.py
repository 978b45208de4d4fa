"""The scheduler: which requests run in the next step, and how many tokens each.

vLLM-v1 style: there are no prefill and decode phases. Every request has
``num_computed_tokens``; each step gives running requests (first) and then
waiting ones a share of the token budget, so prefill chunks and decode tokens
share a batch. When the KV cache is full, the most recently admitted running
request is preempted (its blocks freed, recomputed later) and goes to the
front of the waiting queue, so it resumes before newer requests.

With ``scheduler.policy=priority`` the waiting queue is ordered by
``(priority, arrival_time)``, the victim of a preemption is the running request
with the largest such key, and a waiting request may preempt running requests
of strictly lower priority (larger value) to get blocks or a seat.

With prefix caching, an admitted request starts at the end of its longest
cached prefix (``num_computed_tokens > 0``); blocks are registered in the cache
after the step that computed them (``update_from_output``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.block_hash import model_identity, root_hash
from minivllm.core.block_pool import BlockId, KVCacheBlock
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.request_queue import make_waiting_queue
from minivllm.core.scheduler_output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from minivllm.core.stats import SchedulerStats
from minivllm.engine.request import Request, RequestId, RequestStatus

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineCoreOutput:
    """New tokens of one request after one step."""

    req_id: RequestId
    new_token_ids: list[int]
    new_logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class _StepPlan:
    """Decisions of one ``schedule()`` call, turned into a SchedulerOutput at the end."""

    budget: int
    scheduled: dict[RequestId, int] = field(default_factory=dict)
    new_blocks: dict[RequestId, list[BlockId]] = field(default_factory=dict)
    newly_admitted: list[Request] = field(default_factory=list)
    preempted: bool = False


class Scheduler:
    def __init__(self, cfg: VllmConfig, num_blocks: int) -> None:
        self.max_num_seqs = cfg.scheduler.max_num_seqs
        self.max_num_batched_tokens = cfg.scheduler.max_num_batched_tokens
        self.chunked_prefill = cfg.scheduler.enable_chunked_prefill
        self.policy = cfg.scheduler.policy
        self.kv = KVCacheManager(
            num_blocks,
            cfg.cache.block_size,
            enable_caching=cfg.cache.enable_prefix_caching,
            hash_root=root_hash(model_identity(cfg)),
        )
        self.requests: dict[RequestId, Request] = {}
        self.waiting = make_waiting_queue(self.policy)
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._tokens_sent: dict[RequestId, int] = {}
        """Tokens of each running request the workers already hold."""
        self._forget: set[RequestId] = set()
        """Requests the workers should drop at the next step."""

    # ---- requests in and out --------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
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
        )

    # ---- one step -----------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        plan = _StepPlan(budget=self.max_num_batched_tokens)
        self._schedule_running(plan)
        if not plan.preempted:
            self._schedule_waiting(plan)
        return self._make_output(plan)

    def _schedule_running(self, plan: _StepPlan) -> None:
        """Running requests first, in admission order: decodes and unfinished prefill
        chunks of requests already admitted go before any new prompt."""
        for request in list(self.running):
            if plan.budget <= 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this step
            num_new = min(request.num_tokens - request.num_computed_tokens, plan.budget)
            new_blocks = self._allocate_or_preempt(request, num_new, plan)
            if new_blocks is None:
                continue  # the request itself was preempted
            plan.scheduled[request.request_id] = num_new
            plan.new_blocks[request.request_id] = new_blocks
            plan.budget -= num_new

    def _allocate_or_preempt(self, request: Request, num_new: int, plan: _StepPlan) -> list[BlockId] | None:
        """Blocks for ``num_new`` more tokens of a running request, preempting victims
        (see ``_pick_victim``) until they fit. None when ``request`` itself went."""
        while (new_blocks := self.kv.allocate_slots(request, num_new)) is None:
            victim = self._pick_victim()
            self._preempt(victim, plan)
            if victim is request:
                return None
        return new_blocks

    def _pick_victim(self) -> Request:
        if self.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _schedule_waiting(self, plan: _StepPlan) -> None:
        while self.waiting and plan.budget > 0 and not plan.preempted:
            request = self.waiting[0]
            if not self._claim_seat(request, plan):
                break
            cached = self.kv.get_computed_blocks(request)
            num_new = request.num_tokens - len(cached) * self.kv.block_size
            if num_new > plan.budget and not self.chunked_prefill:
                break
            num_new = min(num_new, plan.budget)
            if not self._allocate_for_waiting(request, num_new, cached, plan):
                break
            self._admit(request, len(cached) * self.kv.block_size, num_new, plan)

    def _claim_seat(self, request: Request, plan: _StepPlan) -> bool:
        """Whether ``request`` may join the running requests under ``max_num_seqs``,
        preempting a lower-priority one for the seat under the priority policy."""
        while len(self.running) >= self.max_num_seqs:
            victim = self._lower_priority_victim(request)
            if victim is None:
                return False
            self._preempt(victim, plan)
        return True

    def _allocate_for_waiting(self, request: Request, num_new: int, cached: list[KVCacheBlock], plan: _StepPlan) -> bool:
        while self.kv.allocate_slots(request, num_new, cached) is None:
            victim = self._lower_priority_victim(request)
            if victim is None:
                return False
            self._preempt(victim, plan)
        return True

    def _lower_priority_victim(self, request: Request) -> Request | None:
        """Under the priority policy, the running request to preempt in favour of the
        waiting ``request``: the lowest-priority one, if strictly below ``request``."""
        if self.policy != "priority" or not self.running:
            return None
        victim = self._pick_victim()
        return victim if victim.priority > request.priority else None

    def _admit(self, request: Request, num_cached: int, num_new: int, plan: _StepPlan) -> None:
        self.waiting.popleft()
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_cached
        self.running.append(request)
        plan.scheduled[request.request_id] = num_new
        plan.newly_admitted.append(request)
        plan.budget -= num_new

    def _preempt(self, request: Request, plan: _StepPlan) -> None:
        """Free a running request's blocks and send it back to wait; if it was already
        scheduled in this step, take it out of the step."""
        self.running.remove(request)
        plan.preempted = True
        if request.request_id in plan.scheduled:
            plan.budget += plan.scheduled.pop(request.request_id)
            plan.new_blocks.pop(request.request_id, None)
        if request in plan.newly_admitted:
            plan.newly_admitted.remove(request)
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
        self._tokens_sent.pop(request.request_id, None)
        self._forget.add(request.request_id)
        self.waiting.appendleft(request)

    def _make_output(self, plan: _StepPlan) -> SchedulerOutput:
        out = SchedulerOutput(num_scheduled_tokens=plan.scheduled, finished_req_ids=self._forget)
        self._forget = set()
        admitted = {r.request_id for r in plan.newly_admitted}
        for req_id, num_new in plan.scheduled.items():
            request = self.requests[req_id]
            if req_id in admitted:
                out.new_reqs.append(self._new_request_data(request))
            else:
                sent = self._tokens_sent[req_id]
                out.cached_reqs.append(
                    CachedRequestData(
                        req_id=req_id,
                        new_token_ids=request.all_token_ids[sent:],
                        new_block_ids=plan.new_blocks[req_id],
                        num_computed_tokens=request.num_computed_tokens,
                    )
                )
            self._tokens_sent[req_id] = request.num_tokens
            request.num_computed_tokens += num_new
        return out

    def _new_request_data(self, request: Request) -> NewRequestData:
        return NewRequestData(
            req_id=request.request_id,
            token_ids=request.all_token_ids,
            num_prompt_tokens=request.num_prompt_tokens,
            sampling_params=request.sampling_params,
            block_ids=self.kv.block_ids(request.request_id),
            num_computed_tokens=request.num_computed_tokens,
        )

    # ---- after the step -------------------------------------------------------------
    def update_from_output(self, sched: SchedulerOutput, output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        results = []
        for req_id in sched.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is None or request.is_finished:
                continue  # aborted meanwhile
            self.kv.cache_blocks(request)
            new_tokens = output.sampled_token_ids.get(req_id)
            if not new_tokens:
                continue  # mid-way through a chunked prefill
            appended = []
            for token in new_tokens:
                request.output_token_ids.append(token)
                appended.append(token)
                if self._check_stop(request, token):
                    break
            results.append(
                EngineCoreOutput(
                    req_id=req_id,
                    new_token_ids=appended,
                    new_logprobs=output.logprobs.get(req_id),
                    finish_reason=request.status.finish_reason,
                    stop_reason=request.stop_reason,
                )
            )
        return results

    def _check_stop(self, request: Request, token: int) -> bool:
        params = request.sampling_params
        if request.num_output_tokens >= params.min_tokens:
            if token == request.eos_token_id and not params.ignore_eos:
                self._finish(request, RequestStatus.FINISHED_STOPPED)
                return True
            if token in params.stop_token_ids:
                request.stop_reason = token
                self._finish(request, RequestStatus.FINISHED_STOPPED)
                return True
        if request.num_output_tokens >= request.max_tokens:
            self._finish(request, RequestStatus.FINISHED_LENGTH)
            return True
        return False

    def _finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        self._tokens_sent.pop(request.request_id, None)
        self._forget.add(request.request_id)
        del self.requests[request.request_id]
