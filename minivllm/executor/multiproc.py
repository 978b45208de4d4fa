"""One worker process per tensor-parallel rank on this machine (``parallel.backend=mp``).

::

    driver (engine process)                        worker processes (spawned)
    collective_rpc(method, args) --pickled--+--> rank 0: Worker --+
                                            +--> rank 1: Worker --+ gloo (CPU) / NCCL (CUDA):
    results[0] <-------- Reply ------------------ rank 0          | all-reduce, all-gather
                                                                  +
The driver waits on every rank's pipe *and* process sentinel at once, so a
rank that dies (or raises) is noticed at once even while the others are
blocked in a collective that will never complete; the executor then stops all
ranks and raises ``WorkerFailedError`` naming the rank and the cause.

Calls may overlap: ``execute_model_async`` sends a step and returns a future
at once (pipeline micro-batching keeps several in flight). Each rank runs its
calls in the order sent and answers in that order, so replies are collected
oldest first; waiting for one call collects every earlier one on the way.

Workers are stopped when the executor is shut down, garbage-collected, or the
interpreter exits (``weakref.finalize``), and exit on their own if the driver
is killed outright.

**The worker's side** (``worker_main``). One duplex pipe per rank. The driver
sends the same bytes to every rank: a pickled ``(seq, call)``, where ``call`` is
the cloudpickled ``(method, args, kwargs)`` (so a user's lambda travels too;
pickled apart, so that a call the worker cannot unpickle still gets a reply).
The worker runs it and answers with a ``Reply`` carrying the same ``seq``, so
the driver can drop replies to a call it stopped waiting for (Ctrl-C). The
first reply (``seq`` 0), sent before any request, says whether the Worker could
be built. A ``None`` call asks the worker to shut down.

A worker ignores SIGINT: Ctrl-C reaches the whole process group, and it is the
driver's to handle (it then stops the workers). A worker whose driver has gone
(killed without a chance to clean up) exits on its own within a second.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing import util as mp_util
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Callable

import cloudpickle

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.distributed.utils import LOCALHOST, get_open_port, spawn_env, threads_per_rank
from minivllm.executor.base import PendingStep, ProcessExecutor, run_method
from minivllm.worker.extension import build_worker

logger = logging.getLogger(__name__)
START_UP = "start-up"
MAIN_GUARD_HINT = (
    "; workers are spawned and import the main module again, so a script that creates an LLM with "
    "parallel.tp > 1 must do it under `if __name__ == '__main__':`"
)
SHUTDOWN = pickle.dumps((-1, None))
"""What the driver sends a worker to make it exit."""


@dataclass
class Reply:
    seq: int
    ok: bool
    value: Any = None
    """The result when ``ok``; otherwise ``"ExceptionType: message"``."""
    traceback: str = ""


def error_reply(seq: int, err: BaseException) -> Reply:
    return Reply(seq, False, f"{type(err).__name__}: {err}", traceback.format_exc())


class MultiprocExecutor(ProcessExecutor):
    shutdown_grace_s = 5.0
    """How long a clean shutdown waits for workers to exit before terminating them."""
    failure_grace_s = 1.0
    """After a rank raises, how long to watch for another rank's death (the likelier cause)."""

    def __init__(self, cfg: VllmConfig) -> None:
        super().__init__(cfg)
        self.world_size = cfg.world_size
        self.num_threads = threads_per_rank(self.world_size)
        self._procs: list[BaseProcess] = []
        self._conns: list[Connection] = []
        self._failure: str | None = None
        self._seq = 0
        self._sent: deque[tuple[int, str]] = deque()
        """Calls sent whose replies are not collected yet, oldest first: (seq, what)."""
        self._replies: dict[int, list[Any]] = {}
        """Collected replies of calls nobody has asked for yet, by seq."""
        self._finalizer = weakref.finalize(self, _stop_workers, self._procs, self._conns, 0.0)
        self._start_and_load(on_error=self._kill_workers)

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    # ---- start ------------------------------------------------------------------------
    def _start_workers(self) -> None:
        self._failure, self._seq = None, 0
        self._sent.clear()
        self._replies.clear()
        init_method = f"tcp://{LOCALHOST}:{get_open_port()}"
        ctx = mp.get_context("spawn")
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=worker_main,
                args=(self.cfg, rank, init_method, self.num_threads, child_end, os.getpid()),
                name=f"minivllm-tp{rank}",
                daemon=True,
            )
            with spawn_env(self.cfg.device_type):
                proc.start()
            child_end.close()
            self._procs.append(proc)
            self._conns.append(parent_end)
        logger.info(
            "started %d worker processes (%d threads each), rendezvous %s",
            self.world_size,
            self.num_threads,
            init_method,
        )
        self._gather(START_UP, 0)
        self.collective_rpc("init_device")

    # ---- calls ------------------------------------------------------------------------
    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        return self._wait(self._send(method, args, kwargs))

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> PendingStep:
        """Send the step to every rank and return at once; the future's ``result()``
        is the output rank's ``ModelRunnerOutput``."""
        seq, rank = self._send("execute_model", (scheduler_output,), None), self.cfg.parallel.output_rank
        return PendingStep(lambda: self._wait(seq)[rank])

    def _send(self, method: str | Callable, args: tuple, kwargs: dict | None) -> int:
        """Send one call to every rank; its seq."""
        what = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
        if self._failure is not None:
            raise RuntimeError(f"the executor has failed and cannot run {what}: {self._failure}")
        if not self._procs:
            raise RuntimeError(f"the executor is shut down; cannot run {what}")
        self._seq += 1
        payload = pickle.dumps((self._seq, cloudpickle.dumps((method, args, kwargs))))  # lambdas and closures too
        for rank, conn in enumerate(self._conns):
            try:
                conn.send_bytes(payload)
            except OSError:
                self._fail(rank, self._death_cause(rank, what), what)
        self._sent.append((self._seq, what))
        return self._seq

    def _wait(self, seq: int) -> list[Any]:
        """The replies to call ``seq``, collecting those of earlier calls first."""
        while seq not in self._replies:
            if self._failure is not None:
                raise RuntimeError(f"the executor has failed: {self._failure}")
            oldest, what = self._sent.popleft()
            self._replies[oldest] = self._gather(what, oldest)
        return self._replies.pop(seq)

    def _gather(self, what: str, seq: int) -> list[Any]:
        """Each rank's reply, in rank order; a rank's failure raises.

        A rank that raised is blamed only after ``failure_grace_s`` without
        another rank dying: when one rank is killed, its peers' collectives
        fail too ("connection reset"), and the dead rank is the cause to report.
        """
        results: list[Any] = [None] * self.world_size
        pending = {conn: rank for rank, conn in enumerate(self._conns)}
        sentinels = {proc.sentinel: rank for rank, proc in enumerate(self._procs)}
        raised: tuple[int, str] | None = None
        deadline: float | None = None
        while pending:
            ready = wait([*pending, *sentinels], None if deadline is None else max(0.0, deadline - time.monotonic()))
            if not ready:  # grace over, nobody died
                break
            for conn in [c for c in ready if c in pending]:  # replies before deaths
                rank = pending.pop(conn)
                try:
                    reply: Reply = conn.recv()
                except (EOFError, OSError):
                    self._fail(rank, self._death_cause(rank, what), what)
                if reply.seq < seq:  # answer to a call abandoned by Ctrl-C
                    pending[conn] = rank
                elif not reply.ok:
                    logger.error("worker rank %d failed in %s:\n%s", rank, what, reply.traceback)
                    if raised is None:
                        raised, deadline = (rank, f"raised {reply.value}"), time.monotonic() + self.failure_grace_s
                else:
                    results[rank] = reply.value
            for sentinel in [s for s in ready if s in sentinels]:
                rank = sentinels.pop(sentinel)
                if rank in pending.values():
                    self._fail(rank, self._death_cause(rank, what), what)
        if raised is not None:
            self._fail(*raised, what)
        return results

    def _death_cause(self, rank: int, what: str) -> str:
        proc = self._procs[rank]
        proc.join(timeout=1.0)
        code = proc.exitcode
        if code is None:
            return "closed its pipe"
        if code < 0:
            return f"died: killed by {signal.Signals(-code).name} (exit code {code})"
        return f"died with exit code {code}" + (MAIN_GUARD_HINT if what == START_UP else "")

    # ---- stop -------------------------------------------------------------------------
    def _kill_workers(self) -> None:
        _stop_workers(self._procs, self._conns, 0.0)

    def shutdown(self) -> None:
        _stop_workers(self._procs, self._conns, self.shutdown_grace_s)


def _stop_workers(procs: list[BaseProcess], conns: list[Connection], grace_s: float) -> None:
    """Ask the workers to exit, terminate those still running after ``grace_s``,
    kill those that ignore that; idempotent. (A module function, so the
    finalizer holds no reference to the executor.)"""
    if grace_s > 0:
        for conn, proc in zip(conns, procs):
            if proc.is_alive():
                try:
                    conn.send_bytes(SHUTDOWN)
                except OSError:
                    pass
        deadline = time.monotonic() + grace_s
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(2.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in conns:
        conn.close()
    procs.clear()
    conns.clear()


# ---- the worker's side ---------------------------------------------------------------------


def worker_main(
    cfg: VllmConfig, rank: int, init_method: str, num_threads: int, conn: Connection, parent_pid: int
) -> None:
    """Entry point of a worker process (``multiprocessing`` spawn target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent(parent_pid)
    try:
        worker = build_worker(cfg, rank=rank, distributed_init_method=init_method, num_threads=num_threads)
    except BaseException as err:
        conn.send(error_reply(0, err))
        _exit_now(1)
    conn.send(Reply(0, True))
    try:
        _serve(worker, conn)
    finally:
        worker.shutdown()
        conn.close()
        _exit_now(0)


def _exit_now(code: int) -> None:
    """Skip the interpreter's teardown: with torch and transformers loaded it
    takes seconds, and the worker has released what it holds. multiprocessing's
    own exit hook still runs (it releases the semaphores tqdm and others made)."""
    mp_util._exit_function()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve(worker: Any, conn: Connection) -> None:
    while True:
        try:
            seq, call = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the driver closed the pipe or died
            return
        if call is None:
            return
        try:
            method, args, kwargs = pickle.loads(call)
            reply = Reply(seq, True, run_method(worker, method, args, kwargs))
        except BaseException as err:
            reply = error_reply(seq, err)
        try:
            conn.send(reply)
        except (BrokenPipeError, EOFError, OSError):
            return
        except Exception as err:  # the result did not pickle
            conn.send(error_reply(seq, err))


def _exit_with_parent(parent_pid: int, interval: float = 0.5) -> None:
    """Exit when the driver is gone, even in the middle of a collective that will never finish."""

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="minivllm-parent-watch", daemon=True).start()
