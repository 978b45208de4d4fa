"""Executors reach the model runner only through the Worker: a user's Worker subclass
(``parallel.worker._target_``) sees every step, synchronous or launched ahead (async
scheduling), and the Worker alone decides which ranks return a step's output."""

from __future__ import annotations

import pytest

from minivllm.config.store import build_config
from minivllm.entrypoints.llm import LLM
from minivllm.outputs import ModelRunnerOutput
from minivllm.sampling_params import SamplingParams
from minivllm.worker.worker import Worker


class StepRecordingWorker(Worker):
    """Records the tokens of every step it launches."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[int] = []

    def execute_model_async(self, sched):
        self.steps.append(sched.total_num_scheduled_tokens)
        return super().execute_model_async(sched)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_users_worker_sees_every_step_the_executor_runs(llama_dir, async_scheduling):
    llm = LLM(
        model=str(llama_dir),
        dtype="float32",
        num_gpu_blocks_override=16,
        overrides=[
            f"parallel.worker._target_={__name__}.StepRecordingWorker",
            f"scheduler.async_scheduling={str(async_scheduling).lower()}",
        ],
    )
    try:
        engine = llm.llm_engine
        executor = engine.core.executor
        assert engine.cfg.async_scheduling is async_scheduling
        sent: list[int] = []

        def recorded(launch):
            def launch_recorded(sched):
                sent.append(sched.total_num_scheduled_tokens)
                return launch(sched)

            return launch_recorded

        for name in ("execute_model", "execute_model_async"):  # what the engine core hands the executor
            setattr(executor, name, recorded(getattr(executor, name)))
        engine.add_request(
            "a", {"prompt_token_ids": list(range(3, 13))}, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        )
        finals = []
        while engine.has_unfinished_requests():
            finals += [out for out in engine.step() if out.finished]
        assert len(finals[0].outputs[0].token_ids) == 4
        worker = executor.worker
        assert isinstance(worker, StepRecordingWorker)
        assert sent[:4] == [10, 1, 1, 1]  # the prefill samples token 1; three decodes
        assert worker.steps == sent
    finally:
        llm.shutdown()


class _Launched:
    """A launched step: counts how often its output is taken."""

    def __init__(self) -> None:
        self.taken = 0
        self.output = ModelRunnerOutput(sampled_token_ids={"a": [7]})

    @property
    def resolved(self) -> bool:
        return self.taken > 0

    def result(self) -> ModelRunnerOutput:
        self.taken += 1
        return self.output


class _Runner:
    def __init__(self) -> None:
        self.launched: list[_Launched] = []

    def execute_model_async(self, sched) -> _Launched:
        self.launched.append(_Launched())
        return self.launched[-1]


def test_only_the_output_rank_returns_a_step_and_every_rank_completes_its_own(llama_dir):
    """tp=2: rank 0 returns the launched step; rank 1 takes its step's output at once (its batch
    keeps the tokens) and returns None, unless its executor needs every rank's output."""
    cfg = build_config([f"model.path={llama_dir}", "parallel.tp=2"])
    workers = [Worker(cfg, rank=rank) for rank in (0, 1)]
    for worker in workers:
        worker.model_runner = _Runner()
    first, second = workers
    assert (first.reports_output, second.reports_output) == (True, False)

    launched = first.execute_model_async(None)
    assert launched is first.model_runner.launched[-1] and not launched.resolved  # the caller takes it
    assert second.execute_model_async(None) is None and second.model_runner.launched[-1].taken == 1
    assert first.execute_model(None) is first.model_runner.launched[-1].output
    assert second.execute_model(None) is None and second.model_runner.launched[-1].taken == 1

    second.reports_output = True  # the external launcher: each process's scheduler needs the tokens
    assert second.execute_model(None) is second.model_runner.launched[-1].output
