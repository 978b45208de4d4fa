"""``AsyncLLM``: the engine for online serving, driven from asyncio.

::

    engine = AsyncLLM.from_kwargs("path/to/hf_dir", dtype="float32")
    async for out in engine.generate("Hello", SamplingParams(max_tokens=8), "req-1"):
        print(out.outputs[0].text)
    await engine.abort("req-2")   # frees its KV blocks before the next step

The ``LLMEngine`` steps in its own process (``engine/engine_proc.py``); this
object lives on the caller's event loop. It tokenizes and validates each request
itself (the same ``Processor`` rules as ``LLM``), so a bad request raises
ValueError before anything reaches the engine; the engine's own checks come back
as the answer to ``add_request``. A reader thread hands the engine's messages to
the event loop, where each request's ``RequestStream`` receives its outputs.

One ``AsyncLLM`` serves one event loop at a time; call ``shutdown()`` when done.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import queue
import threading
import time
import weakref
from typing import Any, AsyncIterator, Protocol, Sequence

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler import SchedulerStats
from minivllm.engine.engine_proc import EngineInfo, EngineMessage, run_engine_proc, unpack_output
from minivllm.engine.outputs import RequestOutput
from minivllm.engine.processor import Processor, PromptType
from minivllm.engine.request_stream import EngineDeadError, RequestStream
from minivllm.engine.tokenizer import get_tokenizer
from minivllm.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)


class StatLogger(Protocol):
    """Receives per-request timings as outputs arrive (the server's metrics)."""

    def on_tokens(self, stream: RequestStream, num_new_tokens: int, now: float) -> None:
        """Called before ``stream.first_token_time``/``last_token_time`` move to ``now``."""

    def on_finished(self, stream: RequestStream, finish_reason: str, now: float) -> None: ...


class AsyncLLM:
    def __init__(self, cfg: VllmConfig, stat_loggers: Sequence[StatLogger] = ()) -> None:
        self.cfg = cfg
        self.tokenizer = get_tokenizer(cfg)
        self.stat_loggers = list(stat_loggers)
        self.errored: str | None = None
        """Why the engine stopped, once it has."""
        self._streams: dict[str, RequestStream] = {}
        self._pending: dict[Any, asyncio.Future] = {}
        self._tokens = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._closing = False
        info = self._start_engine()
        weakref.finalize(self, _stop_process, self._proc)
        self.num_kv_blocks = info.num_blocks
        self.processor = Processor(cfg, self.tokenizer, info.max_tokens_in_cache)
        threading.Thread(target=self._read_loop, name="minivllm-engine-reader", daemon=True).start()
        threading.Thread(target=self._write_loop, name="minivllm-engine-writer", daemon=True).start()

    @classmethod
    def from_kwargs(cls, model: str | None = None, **kwargs: Any) -> "AsyncLLM":
        """Same keywords as ``LLM(model, ...)``."""
        from minivllm.entrypoints.llm import config_from_kwargs

        return cls(VllmConfig.from_dictconfig(config_from_kwargs(model, **kwargs)))

    # ---- the engine process ----------------------------------------------------------
    def _start_engine(self) -> EngineInfo:
        ctx = mp.get_context("spawn")  # fork is unsafe once torch has started threads
        cmd_recv, self._commands = ctx.Pipe(duplex=False)
        self._results, res_send = ctx.Pipe(duplex=False)
        level = logging.getLogger("minivllm").getEffectiveLevel()
        # Not a daemon: with parallel.tp > 1 the engine starts worker processes itself.
        self._proc = ctx.Process(
            target=run_engine_proc, args=(self.cfg, cmd_recv, res_send, level), name="minivllm-engine"
        )
        self._proc.start()
        cmd_recv.close()
        res_send.close()  # so the reader sees EOF when the engine process exits
        try:
            msg = self._results.recv() if self._wait_for_engine() else None
        except EOFError:
            msg = None
        if msg is None or msg.ready is None:
            self._proc.join(5)
            reason = msg.fatal if msg is not None else f"engine process exited (code {self._proc.exitcode})"
            error = ValueError if msg is not None and msg.fatal_is_config_error else RuntimeError
            raise error(reason)
        return msg.ready

    def _wait_for_engine(self) -> bool:
        while not self._results.poll(0.5):
            if not self._proc.is_alive():
                return self._results.poll(0)
        return True

    def _read_loop(self) -> None:
        while True:
            try:
                msg: EngineMessage = self._results.recv()
            except (EOFError, OSError):
                self._call_in_loop(self._on_dead, f"engine process exited (code {self._proc.exitcode})")
                return
            self._call_in_loop(self._on_message, msg, time.monotonic())

    def _call_in_loop(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            if fn is self._on_dead:
                self.errored = args[0]
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def _write_loop(self) -> None:
        """Pickles and writes commands, so the event loop never waits on a full pipe."""
        while (command := self._outbox.get()) is not None:
            try:
                self._commands.send(command)
            except OSError:
                return  # the engine is gone; the reader reports it
        self._commands.close()

    def _send(self, command: tuple) -> None:
        if self.errored is not None:
            raise EngineDeadError(self.errored)
        self._outbox.put(command)

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._streams or self._pending:
                raise RuntimeError("AsyncLLM: in use by requests on another event loop")
            self._loop = loop

    # ---- messages from the engine (on the event loop) ---------------------------------
    def _on_message(self, msg: EngineMessage, now: float) -> None:
        for request_id in msg.added:
            self._resolve(("add", request_id), None)
        for request_id, reason in msg.add_errors.items():
            self._streams.pop(request_id, None)
            self._resolve(("add", request_id), ValueError(reason))
        for token, value in msg.replies.items():
            self._resolve(token, value)
        for packed in msg.outputs:
            self._on_output(unpack_output(packed), now)
        if msg.fatal is not None:
            self._on_dead(f"engine failed: {msg.fatal}")

    def _resolve(self, key: Any, value: Any) -> None:
        fut = self._pending.pop(key, None)
        if fut is None or fut.done():
            return
        if isinstance(value, BaseException):
            fut.set_exception(value)
        else:
            fut.set_result(value)

    def _on_output(self, out: RequestOutput, now: float) -> None:
        stream = self._streams.get(out.request_id)
        if stream is None:
            return  # aborted meanwhile
        new_tokens = sum(len(c.token_ids) for c in out.outputs)
        if new_tokens:
            for stat in self.stat_loggers:
                stat.on_tokens(stream, new_tokens, now)
            stream.first_token_time = stream.first_token_time or now
            stream.last_token_time = now
            stream.num_generation_tokens += new_tokens
        stream.put(out)
        if out.finished:
            del self._streams[out.request_id]
            reason = next((c.finish_reason for c in out.outputs if c.finish_reason), "stop")
            for stat in self.stat_loggers:
                stat.on_finished(stream, reason, now)

    def _on_dead(self, reason: str) -> None:
        if self.errored is None and not self._closing:
            logger.error("%s", reason)
        self.errored = self.errored or reason
        err = EngineDeadError(self.errored)
        for stream in self._streams.values():
            stream.fail(err)
        self._streams.clear()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(err)
        self._pending.clear()

    # ---- public API ------------------------------------------------------------------
    async def add_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams | None = None, priority: int = 0
    ) -> RequestStream:
        """Validate and queue a request; returns once the engine has accepted it.

        Raises ValueError (nothing queued) on bad input, EngineDeadError if the engine is gone.
        """
        self._bind_loop()
        if self.errored is not None:
            raise EngineDeadError(self.errored)
        params = params or SamplingParams()
        text, ids = self.processor.tokenize(prompt)
        self.processor.max_output_tokens(len(ids), params)
        request_id = str(request_id)
        if request_id in self._streams:
            raise ValueError(f"request_id={request_id!r}: already in use by an unfinished request")
        engine_params = params.clone()
        engine_params.output_kind = RequestOutputKind.DELTA
        stream = RequestStream(request_id, text, ids, params, self._abort_now, time.monotonic())
        accepted = self._loop.create_future()
        self._streams[request_id] = stream
        self._pending[("add", request_id)] = accepted
        self._send(("add", request_id, {"prompt": text, "prompt_token_ids": ids}, engine_params, priority))
        try:
            await accepted
        except asyncio.CancelledError:
            self._abort_now(request_id)
            raise
        return stream

    async def generate(
        self, prompt: PromptType, params: SamplingParams | None, request_id: str, priority: int = 0
    ) -> AsyncIterator[RequestOutput]:
        """Stream the request's outputs; breaking out of the loop aborts it."""
        stream = await self.add_request(request_id, prompt, params, priority)
        try:
            async for out in stream:
                yield out
        finally:
            stream.abort()

    async def abort(self, request_ids: str | Sequence[str]) -> None:
        self._abort_now(request_ids)

    def _abort_now(self, request_ids: str | Sequence[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        now = time.monotonic()
        for request_id in ids:
            stream = self._streams.pop(request_id, None)
            self._pending.pop(("add", request_id), None)
            if stream is not None:
                stream.finished = True
                for stat in self.stat_loggers:
                    stat.on_finished(stream, "abort", now)
        if self.errored is None and ids:
            self._send(("abort", ids))

    async def scheduler_stats(self) -> SchedulerStats:
        """Fresh from the engine (answered between two steps)."""
        self._bind_loop()
        token = next(self._tokens)
        reply = self._loop.create_future()
        self._pending[token] = reply
        self._send(("stats", token))
        return await reply

    @property
    def engine_pid(self) -> int | None:
        """The engine process's id (for monitoring)."""
        return self._proc.pid

    @property
    def is_running(self) -> bool:
        return self.errored is None and self._proc.is_alive()

    def get_num_unfinished_requests(self) -> int:
        return len(self._streams)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine process; in-flight requests fail with EngineDeadError."""
        self._closing = True
        if self._proc.is_alive():
            try:
                self._send(("shutdown", None))
            except (OSError, EngineDeadError):
                pass
            self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout)
        self.errored = self.errored or "engine shut down"
        self._outbox.put(None)


def _stop_process(proc: mp.process.BaseProcess) -> None:
    """Last resort at exit or garbage collection: never leave the engine running."""
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
