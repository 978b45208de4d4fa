"""The front end's side of the engine process: start it, write commands, read messages.

Two threads keep the caller's event loop from ever blocking on the pipes: a
writer pickles and sends queued commands (a busy engine may leave the pipe full
for a whole step), and a reader hands each message to a callback. When the
engine process exits, the reader sees end-of-file and reports it.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import threading
import time
import weakref
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
        weakref.finalize(self, _stop_process, self._proc)
        cmd_recv.close()
        res_send.close()  # so the reader sees EOF when the engine process exits
        self.info = self._wait_until_ready()
        self._outbox: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
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

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the engine to stop (it finishes its step), then make sure it has."""
        if self._proc.is_alive():
            self.send(("shutdown", None))
            self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout)
        self._outbox.put(None)


def _stop_process(proc: mp.process.BaseProcess) -> None:
    """Last resort at exit or garbage collection: never leave the engine running."""
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
