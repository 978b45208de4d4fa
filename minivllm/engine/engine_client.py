"""The front end's side of the engine process: start it, write commands, read messages.

Two threads keep the caller's event loop from ever blocking on the pipes: a
writer pickles and sends queued commands (a busy engine may leave the pipe full
for a whole step), and a reader hands each message to a callback. When the
engine process exits, the reader sees end-of-file and reports it.

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
import queue
import threading
import time
from multiprocessing.util import Finalize
from typing import Callable

from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.engine_proc import EngineInfo, EngineMessage, run_engine_proc


class EngineClient:
    def __init__(
        self,
        cfg: VllmConfig,
        on_message: Callable[[EngineMessage, float], None],
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
        self._proc.start()
        self._outbox: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        # At exit (priority >= 0: before multiprocessing joins its children) or when collected;
        # holds no reference to self.
        Finalize(self, _stop_engine, args=(self._proc, self._outbox, EXIT_GRACE_S), exitpriority=EXIT_PRIORITY)
        cmd_recv.close()
        res_send.close()  # so the reader sees EOF when the engine process exits
        self.info = self._wait_until_ready()
        self._on_message, self._on_exit = on_message, on_exit
        threading.Thread(target=self._read_loop, name="minivllm-engine-reader", daemon=True).start()
        threading.Thread(target=self._write_loop, name="minivllm-engine-writer", daemon=True).start()

    def _wait_until_ready(self) -> EngineInfo:
        msg = self._first_message()
        if msg is None or msg.ready is None:
            self._proc.join(5)
            reason = msg.fatal if msg is not None else f"engine process exited (code {self._proc.exitcode})"
            raise (ValueError if msg is not None and msg.fatal_is_config_error else RuntimeError)(reason)
        return msg.ready

    def _first_message(self) -> EngineMessage | None:
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
                msg: EngineMessage = self._results.recv()
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

    def send(self, command: tuple) -> None:
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
    """Queue ``shutdown`` for a live engine; the writer thread sends it after any command still queued."""
    if proc.is_alive():
        outbox.put(("shutdown", None))


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
