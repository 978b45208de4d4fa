"""Pipeline micro-batching (``parallel.pp_microbatches``): two batches in flight through
pp=2 give exactly the tokens of pp=1's synchronous loop (greedy and seeded sampling,
stop strings and stop tokens, an abort mid-run, preemption, prefix caching), and the
batches in flight hold disjoint requests."""

from __future__ import annotations

import pytest

from minivllm.config.store import build_config
from minivllm.engine.llm_engine import LLMEngine
from minivllm.sampling_params import SamplingParams
from tests.engine.test_async_scheduling import PROMPTS, run, workload


def make_engine(llama_dir, *overrides: str, num_blocks: int = 14) -> LLMEngine:
    return LLMEngine(
        build_config(
            [
                f"model.path={llama_dir}",
                "model.dtype=float32",
                "cache.block_size=4",
                f"cache.num_gpu_blocks_override={num_blocks}",
                "cache.enable_prefix_caching=true",
                "scheduler.max_num_seqs=6",
                "scheduler.max_num_batched_tokens=32",
                "scheduler.log_stats_interval=0",
                *overrides,
            ]
        )
    )


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["parallel.pp=2", "parallel.pp_microbatches=0"], r"parallel.pp_microbatches=0"),
        (["parallel.pp_microbatches=2"], r"parallel.pp_microbatches=2: only applies with parallel.pp > 1"),
    ],
)
def test_bad_micro_batch_counts_fail_when_built(overrides, match):
    with pytest.raises(ValueError, match=match):
        build_config(["model=opt-125m", "load.format=dummy", *overrides])


def test_micro_batch_count_defaults_to_one_per_stage():
    assert build_config(["model=opt-125m", "load.format=dummy", "parallel.pp=3"]).parallel.num_microbatches == 3
    assert build_config(["model=opt-125m", "load.format=dummy"]).parallel.num_microbatches == 1


class BatchWatch:
    """Wraps the executor's submit: records the most batches in flight, and checks
    that a batch shares no request with those already in flight. Once, with a batch
    in flight, it calls every rank: the call's replies come after the batch's."""

    def __init__(self, core) -> None:
        self.core, self.most, self.ranks = core, 0, None
        self._submit = core.executor.execute_model_async
        core.executor.execute_model_async = self.submit

    def submit(self, sched):
        for other, _ in self.core._batches:
            assert not set(other.num_scheduled_tokens) & set(sched.num_scheduled_tokens)
        self.most = max(self.most, len(self.core._batches) + 1)
        if self.core._batches and self.ranks is None:
            self.ranks = self.core.executor.collective_rpc(lambda worker: worker.rank)
        return self._submit(sched)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_micro_batches_through_pp2_equal_the_pp1_loop(llama_dir):
    probe_engine = make_engine(llama_dir, num_blocks=256)
    probe, _ = run(probe_engine, [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)] * len(PROMPTS))
    probe_engine.shutdown()
    reference = make_engine(llama_dir)
    expected = run(reference, workload(probe), abort_id="3")
    reference.shutdown()

    engine = make_engine(llama_dir, "parallel.pp=2", "parallel.pp_microbatches=2")
    try:
        watch = BatchWatch(engine.core)
        finals, aborted = run(engine, workload(probe), abort_id="3")
        assert watch.most == 2 and watch.ranks == [0, 1]
        assert engine.core.scheduler.num_preemptions > 0  # 14 blocks are too few for the whole batch
    finally:
        engine.shutdown()
    assert (finals, aborted) == expected
    assert len(aborted) >= 3 and "3" not in finals
