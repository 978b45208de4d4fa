"""The executor interface the engine core talks to.

Every call fans out to all workers through ``collective_rpc``; only the output
rank's ``execute_model`` result is returned (rank 0 with one pipeline stage;
the first rank of the last stage, which samples, with several).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import partial
from typing import Any, Callable

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.outputs import DoneOutput, ModelRunnerOutput, StepResult
from minivllm.worker.extension import check_worker_extension


class WorkerFailedError(RuntimeError):
    """A worker died or raised; the executor is unusable afterwards (its other
    ranks may be stuck in a collective waiting for the one that failed)."""

    def __init__(self, rank: int, cause: str, during: str) -> None:
        super().__init__(f"worker rank {rank} {cause} (during {during}); the engine cannot continue")
        self.rank, self.cause = rank, cause


class Executor(ABC):
    def __init__(self, cfg: VllmConfig) -> None:
        check_worker_extension(cfg)  # here, before any worker starts, rather than in each rank
        self.cfg = cfg

    @abstractmethod
    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        """Call ``method`` on every worker; results in rank order.

        ``method`` is a Worker method name, or a (picklable) function called as
        ``method(worker, *args, **kwargs)`` in each worker's process.
        """

    def determine_kv_cache_spec(self) -> KVCacheSpec:
        """Every rank's ``Worker.determine_kv_cache_spec``, merged: the fewest blocks, and a
        window only when every rank's layers slide."""
        return KVCacheSpec.merge(self.collective_rpc("determine_kv_cache_spec"))

    def initialize_cache(self, num_blocks: int) -> None:
        self.collective_rpc("initialize_cache", (num_blocks,))

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.collective_rpc("execute_model", (sched,))[self.cfg.parallel.output_rank]

    def execute_model_async(self, sched: SchedulerOutput) -> StepResult:
        """Launch a step and return before its tokens are known, where the executor can
        (one worker in this process); elsewhere the step completes before this returns."""
        return DoneOutput(self.execute_model(sched))

    def shutdown(self) -> None:  # noqa: B027 - a hook: executors without processes have nothing to release
        """Release workers and processes; safe to call more than once."""


def run_method(worker: Any, method: str | Callable, args: tuple, kwargs: dict | None) -> Any:
    """What a worker does with one ``collective_rpc`` call."""
    fn = getattr(worker, method) if isinstance(method, str) else partial(method, worker)
    return fn(*args, **(kwargs or {}))
