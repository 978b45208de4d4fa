"""Scheduler behaviour under a token budget and a small KV cache, checked with a fake
runner that verifies every KV position a request reads (see scheduler_helpers)."""

import random

import pytest

from minivllm.request import RequestStatus
from tests.core.scheduler_helpers import (
    FakeRunner,
    base_config,
    expected_output,
    make_request,
    make_scheduler,
    run_to_completion,
    step,
)

BS = 4


@pytest.fixture(scope="module")
def base():
    return base_config()


def test_prefix_hit_starts_mid_sequence_on_the_shared_blocks(base):
    sched = make_scheduler(base, 16, block_size=BS)
    runner = FakeRunner(BS)
    a = make_request(list(range(100, 110)), max_tokens=1)
    sched.add_request(a)
    first = step(sched, runner)
    a_blocks = first.new_reqs[0].block_ids
    sched.add_request(make_request(list(range(100, 108)) + [5, 6, 7], max_tokens=1))
    out = step(sched, runner)
    (new,) = out.new_reqs
    assert new.num_computed_tokens == 8 and new.block_ids[:2] == a_blocks[:2]
    assert out.num_scheduled_tokens[new.req_id] == 3  # only the uncached tail runs
    assert sched.stats().prefix_cache_hits == 8


def test_a_block_seen_after_another_prefix_is_not_a_hit(base):
    sched = make_scheduler(base, 16, block_size=BS)
    runner = FakeRunner(BS)
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    first = make_request(a + b + [9], max_tokens=1)
    sched.add_request(first)
    run_to_completion(sched, runner)
    second = make_request(b + [9, 9], max_tokens=1)  # starts with first's second block
    sched.add_request(second)
    out = step(sched, runner)
    assert out.new_reqs[0].num_computed_tokens == 0
    run_to_completion(sched, runner)
    assert second.output_token_ids == expected_output(second.prompt_token_ids, 1)


def test_long_prompt_is_chunked_while_running_requests_keep_decoding(base):
    sched = make_scheduler(base, 64, block_size=BS, max_num_batched_tokens=8)
    runner = FakeRunner(BS)
    short = make_request([1, 2, 3], max_tokens=12)
    sched.add_request(short)
    step(sched, runner)  # short's prompt; it now decodes
    long = make_request(list(range(200, 230)), max_tokens=2)  # 30 tokens > budget 8
    sched.add_request(long)
    chunks = []
    while long.num_output_tokens == 0:
        out = step(sched, runner)
        assert out.num_scheduled_tokens[short.request_id] == 1  # a decode token every step
        chunks.append(out.num_scheduled_tokens[long.request_id])
        assert out.total_num_scheduled_tokens <= 8
    assert chunks == [7, 7, 7, 7, 2]
    run_to_completion(sched, runner)
    assert long.output_token_ids == expected_output(long.prompt_token_ids, 2)


def test_preemption_takes_the_last_admitted_and_readmits_it_first(base):
    sched = make_scheduler(base, 6, block_size=BS, enable_prefix_caching=False)
    runner = FakeRunner(BS)
    first, second = make_request(list(range(10, 17)), 8), make_request(list(range(20, 27)), 8)
    sched.add_request(first)
    sched.add_request(second)
    step(sched, runner)  # both prompts: 2 blocks each, 2 blocks free
    newer = make_request([5, 6], 2)
    sched.add_request(newer)
    while second.num_preemptions == 0:
        step(sched, runner)
    assert first.status is RequestStatus.RUNNING and first.num_preemptions == 0
    assert sched.waiting[0] is second and list(sched.waiting) == [second, newer]
    run_to_completion(sched, runner)
    for r in (first, second, newer):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.max_tokens)


@pytest.mark.parametrize("caching", [True, False])
def test_many_requests_under_pressure_all_finish_with_unpressured_outputs(base, caching):
    rng = random.Random(1)
    shared = [[rng.randrange(3, 500) for _ in range(rng.randrange(4, 20))] for _ in range(4)]
    prompts = [rng.choice(shared) + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 30))] for _ in range(120)]
    sched = make_scheduler(
        base, 24, block_size=BS, max_num_batched_tokens=16, max_num_seqs=8, enable_prefix_caching=caching
    )
    runner = FakeRunner(BS)
    requests = [make_request(p, max_tokens=rng.randrange(1, 9)) for p in prompts]
    for r in requests:
        sched.add_request(r)
    run_to_completion(sched, runner)
    for r in requests:
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.max_tokens)
    assert sched.num_preemptions > 0
    assert sched.kv.num_free_blocks == 24 and sched.kv.num_shared_blocks() == 0
    stats = sched.stats()
    assert (stats.prefix_cache_hit_rate > 0) == caching


def test_priority_orders_waiting_and_preempts_lower_priority(base):
    sched = make_scheduler(base, 8, block_size=BS, policy="priority", max_num_seqs=2)
    runner = FakeRunner(BS)
    low = make_request(list(range(10, 18)), max_tokens=6, priority=5)
    mid = make_request(list(range(20, 28)), max_tokens=6, priority=3)
    sched.add_request(low)
    sched.add_request(mid)
    step(sched, runner)
    assert sched.running == [mid, low]  # admitted by priority, not arrival
    urgent = make_request(list(range(40, 44)), max_tokens=2, priority=0)
    sched.add_request(urgent)
    out = step(sched, runner)  # no free seat: the lowest priority running request makes room
    assert low.status is RequestStatus.PREEMPTED and low.request_id not in out.num_scheduled_tokens
    assert urgent.request_id in out.num_scheduled_tokens
    run_to_completion(sched, runner)
    for r in (low, mid, urgent):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.max_tokens)


def test_priority_victim_under_memory_pressure_is_the_lowest_priority(base):
    sched = make_scheduler(base, 6, block_size=BS, policy="priority", enable_prefix_caching=False)
    runner = FakeRunner(BS)
    low = make_request(list(range(10, 17)), max_tokens=8, priority=9)
    high = make_request(list(range(20, 27)), max_tokens=8, priority=1)
    sched.add_request(low)
    step(sched, runner)
    sched.add_request(high)
    while low.num_preemptions == 0 and not high.is_finished:
        step(sched, runner)
    assert high.num_preemptions == 0 and low.num_preemptions == 1  # though low was admitted first
    run_to_completion(sched, runner)
    assert low.output_token_ids == expected_output(low.prompt_token_ids, 8)


def test_fcfs_never_preempts_for_a_waiting_request(base):
    sched = make_scheduler(base, 8, block_size=BS, max_num_seqs=1)
    runner = FakeRunner(BS)
    first = make_request([1, 2, 3], max_tokens=5)
    sched.add_request(first)
    step(sched, runner)
    sched.add_request(make_request([4, 5, 6], max_tokens=5))
    step(sched, runner)
    assert sched.num_preemptions == 0 and sched.running == [first]
