"""The executor interface the engine core talks to, and the executor with one worker in
the engine's own process (``UniProcExecutor``, tp=1).

Every call fans out to all workers through ``collective_rpc``; only the output
rank's ``execute_model`` result is returned (rank 0 with one pipeline stage;
the first rank of the last stage, which samples, with several).

Users' own calls to every worker (``LLM.collective_rpc``, ``LLM.apply_model``) go
through ``Executor.user_collective_rpc``. A user's function runs in each worker as
``fn(worker, *args, **kwargs)`` (a method name runs ``worker.<name>(*args,
**kwargs)``); the executors ship it with ``cloudpickle``, so lambdas and closures
reach worker processes too. Unlike the engine's own calls, a user's call that
raises does not stop the engine: each worker catches the error and sends it back
as a ``RemoteError`` value, and the driver raises one ``RuntimeError`` naming the
rank(s) once every rank has answered. (A function that blocks forever in a
collective one rank never joins blocks the engine; that one is the caller's to avoid.)
"""

from __future__ import annotations

import traceback
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, NoReturn

from torch import nn

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.distributed.utils import retry_on_address_in_use
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.outputs import DoneOutput, ModelRunnerOutput, StepResult
from minivllm.worker.extension import build_worker, check_worker_extension


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

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.collective_rpc("execute_model", (scheduler_output,))[self.cfg.parallel.output_rank]

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> StepResult:
        """Launch a step and return before its tokens are known, where the executor can
        (one worker in this process); elsewhere the step completes before this returns."""
        return DoneOutput(self.execute_model(scheduler_output))

    def user_collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        """A user's call on every worker: one result per rank, in rank order; a rank's error
        raises RuntimeError naming it (the engine keeps serving)."""
        if not (isinstance(method, str) or callable(method)):
            raise ValueError(f"collective_rpc: method={method!r} must be a Worker method name or a callable")
        if not isinstance(args, (tuple, list)):
            raise ValueError(f"collective_rpc: args={args!r} must be a tuple")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise ValueError(f"collective_rpc: kwargs={kwargs!r} must be a dict or None")
        results = self.collective_rpc(run_user_call, (method, tuple(args), kwargs))
        return raise_remote_errors(method, results)

    def shutdown(self) -> None:  # noqa: B027 - a hook: executors without processes have nothing to release
        """Release workers and processes; safe to call more than once."""


class UniProcExecutor(Executor):
    """One worker in the engine's own process (tp=1)."""

    def __init__(self, cfg: VllmConfig) -> None:
        super().__init__(cfg)
        self.worker = build_worker(cfg, rank=0)
        self.worker.init_device()
        self.worker.load_model()

    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        return [run_method(self.worker, method, args, kwargs)]

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> StepResult:
        return self.worker.execute_model_async(scheduler_output)  # rank 0: the output rank

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
            self.worker = None


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


@dataclass(frozen=True)
class RemoteError:
    """What a user's call raised on one rank."""

    rank: int
    message: str
    """``"ExceptionType: message"``."""
    traceback: str


def run_user_call(worker: Any, method: str | Callable, args: tuple, kwargs: dict | None) -> Any:
    """Runs in a worker: the call's result, or a ``RemoteError`` instead of raising."""
    try:
        return run_method(worker, method, args, kwargs)
    except Exception as err:
        return RemoteError(getattr(worker, "rank", 0), f"{type(err).__name__}: {err}", traceback.format_exc())


def apply_to_model(worker: Any, fn: Callable[[nn.Module], Any]) -> Any:
    """Runs in a worker: ``fn`` applied to this rank's model."""
    return fn(worker.get_model())


def describe(method: str | Callable) -> str:
    return method if isinstance(method, str) else getattr(method, "__qualname__", repr(method))


def raise_remote_errors(method: str | Callable, results: list[Any]) -> list[Any]:
    """``results`` unchanged, unless a rank raised: then a RuntimeError naming each such rank."""
    errors = [r for r in results if isinstance(r, RemoteError)]
    if not errors:
        return results
    ranks = ", ".join(str(e.rank) for e in errors)
    first = errors[0]
    raise RuntimeError(
        f"collective_rpc({describe(method)}): worker rank {first.rank} raised {first.message}"
        + (f" (ranks that raised: {ranks})" if len(errors) > 1 else "")
        + f"\n--- rank {first.rank}'s traceback ---\n{first.traceback}"
    )
