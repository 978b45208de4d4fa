"""The executor interface the engine core talks to.

Every call fans out to all workers through ``collective_rpc``; only the output
rank's ``execute_model`` result is returned (rank 0 with one pipeline stage;
the first rank of the last stage, which samples, with several).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import partial
from typing import Any, Callable, NoReturn

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.distributed.utils import retry_on_address_in_use
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


class ProcessExecutor(Executor):
    """An executor whose workers live in other processes (multiproc, Ray): it starts them with
    a retry when the rendezvous port was taken meanwhile, and fails for good once one dies or raises."""

    _failure: str | None
    """Why the executor failed (set by ``_fail``); every later call refuses with it."""

    @abstractmethod
    def _start_workers(self) -> None:
        """Start every rank and wait for its rendezvous."""

    @abstractmethod
    def _kill_workers(self) -> None:
        """Stop every rank now; idempotent."""

    def _start_and_load(self, on_error: Callable[[], None]) -> None:
        """Start the workers and load the model; on any failure, ``on_error()`` and re-raise."""
        try:
            retry_on_address_in_use(self._start_workers, self._kill_workers, type(self).__name__)
            self.collective_rpc("load_model")
        except BaseException:
            on_error()
            raise

    def _fail(self, rank: int, cause: str, what: str) -> NoReturn:
        err = WorkerFailedError(rank, cause, what)
        self._failure = str(err)
        self._kill_workers()
        raise err


class PendingStep:
    """A step sent to workers in other processes: its output, collected when first asked for (at most once)."""

    def __init__(self, collect: Callable[[], ModelRunnerOutput]) -> None:
        self._collect = collect
        self._output: ModelRunnerOutput | None = None

    @property
    def resolved(self) -> bool:
        return self._output is not None

    def result(self) -> ModelRunnerOutput:
        if self._output is None:
            self._output = self._collect()
        return self._output


def run_method(worker: Any, method: str | Callable, args: tuple, kwargs: dict | None) -> Any:
    """What a worker does with one ``collective_rpc`` call."""
    fn = getattr(worker, method) if isinstance(method, str) else partial(method, worker)
    return fn(*args, **(kwargs or {}))
