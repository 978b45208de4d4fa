import logging

import pytest

from minivllm import LLM, SamplingParams
from minivllm.core.stats import SchedulerStats
from minivllm.engine.stats import StatLogger


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sched_stats(**kw) -> SchedulerStats:
    base = dict(
        num_running=3,
        num_waiting=5,
        num_preempted=1,
        kv_cache_usage=0.5,
        num_preemptions=2,
        prefix_cache_queries=200,
        prefix_cache_hits=50,
    )
    return SchedulerStats(**{**base, **kw})


def test_logs_one_line_per_interval_with_window_throughputs(caplog):
    clock = FakeClock()
    stat_logger = StatLogger(interval_s=5.0, clock=clock)
    caplog.set_level(logging.INFO, logger="minivllm.engine.stats")
    stat_logger.record_step(num_prompt_tokens=400, num_generation_tokens=30)
    clock.now += 4.0
    assert stat_logger.maybe_log(sched_stats) is None
    stat_logger.record_step(num_prompt_tokens=100, num_generation_tokens=20)
    clock.now += 1.0
    logged = stat_logger.maybe_log(sched_stats)
    assert logged.prompt_throughput == pytest.approx(100.0) and logged.generation_throughput == pytest.approx(10.0)
    assert caplog.messages == [
        "Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 10.0 tokens/s, Running: 3 reqs, "
        "Waiting: 5 reqs, Preempted: 1 reqs, KV cache usage: 50.0%, Prefix cache hit rate: 25.0%"
    ]
    clock.now += 2.0  # a new window: nothing recorded in it yet
    snap = stat_logger.snapshot(sched_stats())
    assert snap.prompt_throughput == 0.0 and snap.window_s == pytest.approx(2.0)
    assert snap.num_prompt_tokens == 500 and snap.num_generation_tokens == 50


def test_interval_zero_never_logs(caplog):
    clock = FakeClock()
    stat_logger = StatLogger(interval_s=0.0, clock=clock)
    caplog.set_level(logging.INFO, logger="minivllm.engine.stats")
    clock.now += 1000
    assert stat_logger.maybe_log(sched_stats) is None and not caplog.messages


def test_engine_stats_after_a_shared_prefix_workload(llama_dir, caplog):
    caplog.set_level(logging.INFO, logger="minivllm.engine.stats")
    llm = LLM(
        model=str(llama_dir),
        dtype="float32",
        block_size=4,
        num_gpu_blocks_override=64,
        max_num_batched_tokens=32,
        overrides=["scheduler.log_stats_interval=1e-6"],
    )
    system = list(range(20, 44))
    prompts = [{"prompt_token_ids": system + [50 + i, 60 + i]} for i in range(6)]
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
        stats = llm.llm_engine.get_stats()
    finally:
        llm.shutdown()
    assert stats.num_prompt_tokens == 6 * 26 and stats.num_generation_tokens == sum(
        len(o.outputs[0].token_ids) for o in outs
    )
    assert stats.num_running == stats.num_waiting == 0 and stats.kv_cache_usage == 0.0
    # Request 0 computes the 24-token system prompt (6 blocks); requests 1-5 find it, even those
    # admitted in the same step, and compute their last 2 tokens only.
    assert stats.prefix_cache_queries == 6 * 26 and stats.prefix_cache_hits == 5 * 24
    assert stats.prefix_cache_hit_rate == pytest.approx(120 / 156)
    assert caplog.messages and all(m.startswith("Avg prompt throughput:") for m in caplog.messages)


def test_priority_needs_the_priority_policy(llama_dir):
    llm = LLM(model=str(llama_dir), dtype="float32", block_size=4, num_gpu_blocks_override=32)
    params = SamplingParams(temperature=0, max_tokens=2)
    try:
        with pytest.raises(ValueError, match=r"scheduler.policy=priority, LLM\(scheduling_policy='priority'\)"):
            llm.llm_engine.add_request(None, [5, 6, 7], params, priority=3)
        assert not llm.llm_engine.has_unfinished_requests()
        assert len(llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0].token_ids) == 2
    finally:
        llm.shutdown()
