"""Pipeline micro-batching in the scheduler: batches in flight hold disjoint requests,
every request still gets exactly the synchronous loop's tokens (with preemption of
requests in flight and prefix caching), and a stage that does not sample learns
the last stage's tokens from ``CachedRequestData.new_token_ids``."""

from __future__ import annotations

import copy
from collections import deque

from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.kv_cache_spec import KVCacheSpec
from tests.core.scheduler_helpers import FakeRunner, base_config, expected_output, make_request


class EarlierStage:
    """A non-last stage's view: tokens only from new requests and ``new_token_ids``.
    Before a step it must hold every input token the last stage holds."""

    def __init__(self, last: FakeRunner) -> None:
        self.last = last
        self.tokens: dict[str, list[int]] = {}
        self.num_prompt: dict[str, int] = {}

    def execute(self, scheduler_output: SchedulerOutput) -> None:
        """Runs before the last stage executes ``scheduler_output`` (so its states are from the step before)."""
        for req_id in scheduler_output.forget_req_ids:
            self.tokens.pop(req_id, None)
        for new in scheduler_output.new_reqs:
            self.tokens[new.req_id] = list(new.token_ids)
            self.num_prompt[new.req_id] = new.num_prompt_tokens
        cached = scheduler_output.cached_reqs
        assert len(cached.new_token_ids) == len(cached)
        for req_id, computed, new_tokens, n in zip(
            cached.req_ids,
            cached.num_computed_tokens,
            cached.new_token_ids,
            map(scheduler_output.num_scheduled_tokens.get, cached.req_ids),
        ):
            tokens = self.tokens[req_id]
            start = max(computed, self.num_prompt[req_id])
            tokens[start : start + len(new_tokens)] = new_tokens
            assert tokens[: computed + n] == self.last.states[req_id]["tokens"][: computed + n], req_id


def pipelined_scheduler(num_blocks: int, microbatches: int, **fields) -> Scheduler:
    cfg = copy.deepcopy(base_config())
    cfg.parallel.pp, cfg.parallel.pp_microbatches = 2, microbatches
    for name, value in fields.items():
        setattr(cfg.cache if hasattr(cfg.cache, name) else cfg.scheduler, name, value)
    return Scheduler(cfg, KVCacheSpec(cfg.cache.block_size, num_blocks))


def run_pipelined(scheduler: Scheduler, requests: list, microbatches: int) -> tuple[int, int]:
    """The engine core's batch queue over fake stages; (most batches in flight, preemptions
    of requests in flight)."""
    last = FakeRunner(scheduler.kv.block_size)
    first = EarlierStage(last)
    for r in requests:
        scheduler.add_request(r)
    queue: deque = deque()
    most, steps, preempted_in_flight = 0, 0, 0
    while scheduler.has_unfinished_requests() or queue:
        submitted = False
        if len(queue) < microbatches:
            scheduler_output = scheduler.schedule()
            preempted = {r for r in scheduler_output.forget_req_ids if r in scheduler.requests}
            for other, _ in queue:
                assert not set(other.num_scheduled_tokens) & set(scheduler_output.num_scheduled_tokens)  # disjoint
                preempted_in_flight += len(preempted & set(other.num_scheduled_tokens))
            if not scheduler_output.is_empty or scheduler_output.forget_req_ids:
                first.execute(scheduler_output)
                queue.append((scheduler_output, last.execute(scheduler_output)))  # every stage runs batches in order
                submitted = not scheduler_output.is_empty
        most = max(most, len(queue))
        if queue and not (submitted and len(queue) < microbatches):
            scheduler_output, output = queue.popleft()
            scheduler.update_from_output(scheduler_output, output)
        steps += 1
        assert steps < 5_000, "no progress"
    return most, preempted_in_flight


def test_two_batches_in_flight_hold_disjoint_requests_and_give_the_synchronous_tokens():
    requests = [make_request(list(range(5 + i, 12 + 2 * i)), max_tokens=6) for i in range(6)]
    scheduler = pipelined_scheduler(num_blocks=64, microbatches=2, block_size=4)
    most, _ = run_pipelined(scheduler, requests, microbatches=2)
    assert most == 2
    for r in requests:
        assert r.output_token_ids == expected_output(r.prompt_token_ids, 6), r.request_id
    assert scheduler.kv.num_free_blocks == 64 and not scheduler.in_flight


def test_preempting_requests_in_flight_and_prefix_hits_keep_the_tokens():
    """A cache too small for every request: requests in flight are preempted, and a shared
    prefix is cached while its batch is still in flight."""
    shared = list(range(100, 108))
    requests = [make_request(shared + [200 + i, 300 + i], max_tokens=8) for i in range(5)]
    scheduler = pipelined_scheduler(
        num_blocks=10, microbatches=2, enable_prefix_caching=True, block_size=4, max_num_batched_tokens=16
    )
    _, preempted_in_flight = run_pipelined(scheduler, requests, microbatches=2)
    assert preempted_in_flight > 0
    assert scheduler.kv.prefix_cache_stats.hits > 0
    for r in requests:
        assert r.output_token_ids == expected_output(r.prompt_token_ids, 8), r.request_id


def test_without_micro_batching_nothing_is_tracked():
    scheduler = pipelined_scheduler(num_blocks=16, microbatches=1)
    assert scheduler.in_flight is None and scheduler.send_token_ids
