"""The engine process behind ``AsyncLLM`` and ``DataParallelEngine``: an ``LLMEngine``
stepping in a loop (``EngineLoop``, in the engine process), and the front end's end of
its pipes (``EngineClient``).

The front end (HTTP handlers, the asyncio loop) and the step loop live in
different processes, so neither waits on the other's GIL. They talk over two
one-way pipes of pickled messages (``messages.py``). Commands are drained between
steps, never during one, so an abort frees its blocks before the next step is
scheduled.

On the front end's side two threads keep the caller's event loop from ever
blocking on the pipes: a writer pickles and sends queued commands (a busy engine
may leave the pipe full for a whole step), and a reader hands each message to a
callback. When the engine process exits, the reader sees end-of-file and reports it.

Stopping: the engine ignores SIGINT and SIGTERM (the parent owns shutdown) and
is not a daemon (with parallel.tp > 1 it starts worker processes itself), so it
is asked to stop through the pipe and killed only if it does not. An engine
still running when the interpreter exits (a script that raised with its ``LLM``
alive: the traceback and the module keep it) is stopped the same way by a
``multiprocessing.util.Finalize``: those run at exit before multiprocessing
joins its non-daemon children, which would otherwise wait forever for an
engine that is waiting for commands.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import queue
import signal
import threading
import time
import traceback
from multiprocessing.connection import Connection
from multiprocessing.util import Finalize
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from minivllm.config.vllm_config import VllmConfig
from minivllm.distributed.utils import spawn_env
from minivllm.engine.messages import (
    AbortRequests,
    AddRequest,
    Call,
    CollectiveRpc,
    Command,
    EngineFailed,
    EngineOutputs,
    EngineReady,
    GetStats,
    IsSleeping,
    Shutdown,
    Sleep,
    WakeUp,
)
from minivllm.outputs import RequestOutput

if TYPE_CHECKING:
    from minivllm.engine.llm_engine import LLMEngine

# ---- the engine's side --------------------------------------------------------------------


class EngineLoop:
    """An ``LLMEngine`` driven by commands: each command type has its handler, and each
    round of commands and each step makes one ``EngineOutputs``."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._handlers: dict[type, Callable[[Any, EngineOutputs], None]] = {
            AddRequest: self._add,
            AbortRequests: self._abort,
            GetStats: self._stats,
            CollectiveRpc: self._collective_rpc,
            Sleep: self._sleep,
            WakeUp: self._wake_up,
            IsSleeping: self._is_sleeping,
        }

    def apply(self, commands: Iterable[Command], out: EngineOutputs) -> bool:
        """Apply ``commands`` in order, adding what they answer to ``out``; False at ``Shutdown``
        (the commands after it are left)."""
        for command in commands:
            if isinstance(command, Shutdown):
                return False
            handler = self._handlers.get(type(command))
            if handler is None:
                raise ValueError(f"engine process: unknown command {command!r}")
            handler(command, out)
        return True

    def step(self) -> EngineOutputs:
        """One engine step, its outputs for the front end (deltas; pooled vectors as they are)."""
        out = EngineOutputs()
        for result in self.engine.step():
            if isinstance(result, RequestOutput):
                out.outputs.append(result)
            else:
                out.pooled.append(result)
        return out

    def run(self, commands: Connection, results: Connection) -> None:
        """Block while idle; between steps, only look for commands. Returns at ``Shutdown``."""
        engine = self.engine
        while True:
            idle = not engine.has_unfinished_requests()
            out = EngineOutputs()
            if commands.poll(None if idle else 0):
                if not self.apply(_received(commands), out):
                    return
            if out:
                results.send(out)
            if engine.has_unfinished_requests():
                out = self.step()
                if out:
                    results.send(out)

    def _add(self, command: AddRequest, out: EngineOutputs) -> None:
        request_id = command.request.request_id
        try:
            self.engine.add_processed(command.request)
            out.added.append(request_id)
        except ValueError as err:
            out.refused[request_id] = str(err)

    def _abort(self, command: AbortRequests, out: EngineOutputs) -> None:
        self.engine.abort_request(command.request_ids)

    def _stats(self, command: GetStats, out: EngineOutputs) -> None:
        out.replies[command.token] = self.engine.scheduler_stats()

    def _collective_rpc(self, command: CollectiveRpc, out: EngineOutputs) -> None:
        """A user's call: its results, or the error it raised (as a value)."""
        try:
            method, args, kwargs = pickle.loads(command.call)
            out.replies[command.token] = self.engine.collective_rpc(method, args, kwargs)
        except Exception as err:  # noqa: BLE001 - the caller raises it
            out.replies[command.token] = RuntimeError(str(err))

    def _sleep(self, command: Sleep, out: EngineOutputs) -> None:
        self._answer(command, out, self.engine.sleep, command.level)

    def _wake_up(self, command: WakeUp, out: EngineOutputs) -> None:
        self._answer(command, out, self.engine.wake_up, command.tags)

    def _is_sleeping(self, command: IsSleeping, out: EngineOutputs) -> None:
        self._answer(command, out, self.engine.is_sleeping)

    @staticmethod
    def _answer(command: Call, out: EngineOutputs, method: Callable, *args: Any) -> None:
        """``method(*args)`` as the reply; the ValueError it raises comes back as the reply."""
        try:
            out.replies[command.token] = method(*args)
        except ValueError as err:
            out.replies[command.token] = ValueError(str(err))


def _received(commands: Connection) -> Iterator[Command]:
    """The commands queued in the pipe, without waiting for more."""
    while commands.poll(0):
        yield commands.recv()


def run_engine_proc(cfg: VllmConfig, commands: Connection, results: Connection, log_level: int) -> None:
    """Entry point of the engine process (started with the ``spawn`` method)."""
    # The parent owns shutdown: Ctrl-C or SIGTERM sent to the process group must
    # not kill the engine under in-flight requests. A dead parent closes the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s [engine] %(levelname)s %(name)s: %(message)s")
    from minivllm.engine.llm_engine import LLMEngine

    try:
        engine = LLMEngine(cfg)
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises it
        results.send(failed(err))
        return
    results.send(EngineReady(kv_spec=engine.core.kv_spec))
    try:
        EngineLoop(engine).run(commands, results)
    except (EOFError, OSError, BrokenPipeError):
        pass  # the front end is gone
    except BaseException as err:  # noqa: BLE001
        try:
            results.send(failed(err, at_start=False))
        except OSError:
            pass
    finally:
        engine.shutdown()


def failed(err: BaseException, at_start: bool = True) -> EngineFailed:
    """Why the engine stopped: a ValueError's message (a bad config, at start-up), else the traceback."""
    if isinstance(err, ValueError):
        return EngineFailed(str(err), config_error=at_start)
    return EngineFailed("".join(traceback.format_exception(type(err), err, err.__traceback__)))


# ---- the front end's side -----------------------------------------------------------------


class EngineClient:
    def __init__(
        self,
        cfg: VllmConfig,
        on_message: Callable[[EngineOutputs | EngineFailed, float], None],
        on_exit: Callable[[str], None],
    ) -> None:
        """Start the engine process and wait until its model is loaded.

        ``on_message(msg, arrival_time)`` and ``on_exit(reason)`` run on the reader thread.
        Raises ValueError for a config the engine refused, RuntimeError if it crashed.
        """
        ctx = mp.get_context("spawn")  # fork is unsafe once torch has started threads
        cmd_recv, self._commands = ctx.Pipe(duplex=False)
        self._results, res_send = ctx.Pipe(duplex=False)
        level = logging.getLogger("minivllm").getEffectiveLevel()
        # Not a daemon: with parallel.tp > 1 the engine starts worker processes itself.
        self._proc = ctx.Process(target=run_engine_proc, args=(cfg, cmd_recv, res_send, level), name="minivllm-engine")
        with spawn_env(cfg.device_type):  # passive OpenMP threads on the CPU (distributed/utils.py)
            self._proc.start()
        self._outbox: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        # At exit (priority >= 0: before multiprocessing joins its children) or when collected;
        # holds no reference to self.
        Finalize(self, _stop_engine, args=(self._proc, self._outbox, EXIT_GRACE_S), exitpriority=EXIT_PRIORITY)
        cmd_recv.close()
        res_send.close()  # so the reader sees EOF when the engine process exits
        self.info = self._wait_until_ready()
        self._on_message, self._on_exit = on_message, on_exit
        threading.Thread(target=self._read_loop, name="minivllm-engine-reader", daemon=True).start()
        threading.Thread(target=self._write_loop, name="minivllm-engine-writer", daemon=True).start()

    def _wait_until_ready(self) -> EngineReady:
        msg = self._first_message()
        if not isinstance(msg, EngineReady):
            self._proc.join(5)
            if msg is None:
                raise RuntimeError(f"engine process exited (code {self._proc.exitcode})")
            raise (ValueError if msg.config_error else RuntimeError)(msg.reason)
        return msg

    def _first_message(self) -> EngineReady | EngineFailed | None:
        """The engine's first message (ready, or why not); None if it died silently."""
        while not self._results.poll(0.5):
            if not self._proc.is_alive() and not self._results.poll(0):
                return None
        try:
            return self._results.recv()
        except EOFError:
            return None

    def _read_loop(self) -> None:
        while True:
            try:
                msg: EngineOutputs | EngineFailed = self._results.recv()
            except (EOFError, OSError):
                self._proc.join(1)
                self._on_exit(f"engine process exited (code {self._proc.exitcode})")
                return
            self._on_message(msg, time.monotonic())

    def _write_loop(self) -> None:
        while (command := self._outbox.get()) is not None:
            try:
                self._commands.send(command)
            except OSError:
                return  # the engine is gone; the reader reports it
        self._commands.close()

    def send(self, command: Command) -> None:
        """Queue a command; never blocks."""
        self._outbox.put(command)

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def is_alive(self) -> bool:
        return self._proc.is_alive()

    def request_stop(self) -> None:
        """Ask the engine to stop after its step, without waiting (``shutdown`` waits)."""
        _request_stop(self._proc, self._outbox)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the engine to stop (it finishes its step), then make sure it has."""
        _stop_engine(self._proc, self._outbox, timeout)


EXIT_GRACE_S = 5.0
"""How long an engine left running at exit gets to stop before it is killed."""
EXIT_PRIORITY = 10
"""Of the ``Finalize`` that stops the engine at exit; any priority >= 0 runs before multiprocessing
joins its children."""


def _request_stop(proc: mp.process.BaseProcess, outbox: queue.SimpleQueue) -> None:
    """Queue ``Shutdown`` for a live engine; the writer thread sends it after any command still queued."""
    if proc.is_alive():
        outbox.put(Shutdown())


def _stop_engine(proc: mp.process.BaseProcess, outbox: queue.SimpleQueue, grace_s: float) -> None:
    """Ask the engine to stop, wait ``grace_s``, then kill it: the engine ignores SIGTERM, so
    ``terminate()`` would not stop it. Idempotent; a module function, so a finalizer holds no
    reference to the client."""
    if proc.is_alive():
        _request_stop(proc, outbox)
        proc.join(grace_s)
    if proc.is_alive():
        proc.kill()
        proc.join(grace_s)
    outbox.put(None)
