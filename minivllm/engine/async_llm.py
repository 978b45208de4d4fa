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
as the answer to ``add_request``. ``EngineClient`` hands the engine's messages
to the event loop, where each request's ``RequestStream`` receives its outputs.

With ``parallel.dp > 1`` there is one engine process per data-parallel
replica, and each request goes to the replica ``LoadBalancer`` picks (fewest
unfinished requests; the one holding its prefix when prefix caching is on).

One ``AsyncLLM`` serves one event loop at a time; call ``shutdown()`` when done.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, AsyncIterator, Protocol, Sequence

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler import SchedulerStats
from minivllm.data_parallel.balancer import LoadBalancer
from minivllm.data_parallel.replicas import merge_stats, start_engines
from minivllm.engine.engine_proc import EngineMessage, unpack_output
from minivllm.engine.outputs import RequestOutput
from minivllm.engine.processor import Processor, PromptType
from minivllm.engine.request_stream import EngineDeadError, RequestStream
from minivllm.engine.tokenizer import get_tokenizer
from minivllm.lora.request import LoRARequest
from minivllm.pooling.outputs import PoolingRequestOutput
from minivllm.pooling.params import PoolingParams
from minivllm.sample.custom_processors import check_picklable
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
        self._closing = False
        self._clients = start_engines(cfg, self._from_engine, self._engine_exited)
        self.num_kv_blocks = min(c.info.num_blocks for c in self._clients)
        max_tokens = min(c.info.max_tokens_in_cache for c in self._clients)  # a request must fit any replica
        self.processor = Processor(cfg, self.tokenizer, max_tokens)
        self.balancer = LoadBalancer(len(self._clients), cfg.cache.block_size, cfg.cache.enable_prefix_caching)
        self._replica_of: dict[str, int] = {}
        """Unfinished request id -> the data-parallel replica running it."""

    @classmethod
    def from_kwargs(cls, model: str | None = None, **kwargs: Any) -> "AsyncLLM":
        """Same keywords as ``LLM(model, ...)``."""
        from minivllm.engine.llm_kwargs import config_from_kwargs

        return cls(VllmConfig.from_dictconfig(config_from_kwargs(model, **kwargs)))

    # ---- the engine process ----------------------------------------------------------
    def _from_engine(self, replica: int, msg: EngineMessage, now: float) -> None:
        self._call_in_loop(self._on_message, msg, now)  # (on the reader thread)

    def _engine_exited(self, replica: int, reason: str) -> None:
        if len(self._clients) > 1:
            reason = f"data-parallel replica {replica}: {reason}"
        if not self._call_in_loop(self._on_dead, reason):
            self.errored = self.errored or reason

    def _call_in_loop(self, fn: Any, *args: Any) -> bool:
        """Run ``fn`` on the bound event loop; False if there is none (any more)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return False
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed meanwhile
            return False
        return True

    def _send(self, command: tuple, replica: int = 0) -> None:
        if self.errored is not None:
            raise EngineDeadError(self.errored)
        self._clients[replica].send(command)

    def _done_on_replica(self, request_id: str) -> None:
        replica = self._replica_of.pop(request_id, None)
        if replica is not None:
            self.balancer.finished(replica)

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
            self._done_on_replica(request_id)
            self._resolve(("add", request_id), ValueError(reason))
        for token, value in msg.replies.items():
            self._resolve(token, value)
        for packed in msg.outputs:
            self._on_output(unpack_output(packed), now)
        for pooled in msg.pooled:
            self._done_on_replica(pooled.request_id)
            self._resolve(("pooled", pooled.request_id), pooled)
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
            self._done_on_replica(out.request_id)
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
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | None = None,
        priority: int = 0,
        group_id: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> RequestStream:
        """Validate and queue a request; returns once the engine has accepted it.
        ``group_id``: the client request it is part of (the scheduler takes turns between them).
        ``lora_request``: the adapter to run under (needs ``lora.enable_lora``).

        Raises ValueError (nothing queued) on bad input, EngineDeadError if the engine is gone.
        """
        self._bind_loop()
        if self.errored is not None:
            raise EngineDeadError(self.errored)
        params = params or SamplingParams()
        self.processor.lora.check(lora_request)
        text, ids = self.processor.tokenize(prompt, params.truncate_prompt_tokens)
        self.processor.max_output_tokens(len(ids), params)
        check_picklable(params)  # the engine runs in another process
        request_id = str(request_id)
        if request_id in self._streams:
            raise ValueError(f"request_id={request_id!r}: already in use by an unfinished request")
        engine_params = params.clone()
        engine_params.output_kind = RequestOutputKind.DELTA
        stream = RequestStream(request_id, text, ids, params, self._abort_now, time.monotonic())
        accepted = self._loop.create_future()
        self._streams[request_id] = stream
        self._pending[("add", request_id)] = accepted
        replica = self._replica_of[request_id] = self.balancer.pick(ids)
        prompt_ids = {"prompt": text, "prompt_token_ids": ids}
        command = ("add", request_id, prompt_ids, engine_params, priority, group_id, lora_request)
        self._send(command, replica)
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

    async def encode(
        self, prompt: PromptType, params: PoolingParams, request_id: str, priority: int = 0,
        group_id: str | None = None,
    ) -> PoolingRequestOutput:  # fmt: skip
        """The pooled vector of one prompt (model.runner=pooling). Raises ValueError (nothing queued)
        on bad input; cancelling the await aborts the request. ``group_id`` as for ``add_request``."""
        self._bind_loop()
        if self.errored is not None:
            raise EngineDeadError(self.errored)
        if self.cfg.model.runner != "pooling":
            raise ValueError("input: this engine generates; embeddings need model.runner=pooling")
        params.check(self.cfg.hf_config, self.cfg.hf_config.hidden_size)
        text, ids = self.processor.tokenize(prompt, params.truncate_prompt_tokens)
        accepted, pooled = self._loop.create_future(), self._loop.create_future()
        self._pending[("add", request_id)], self._pending[("pooled", request_id)] = accepted, pooled
        replica = self._replica_of[request_id] = self.balancer.pick(ids)
        self._send(("add", request_id, {"prompt": text, "prompt_token_ids": ids}, params, priority, group_id, None),
                   replica)  # fmt: skip
        try:
            await accepted
            return await pooled
        except BaseException:
            self._pending.pop(("pooled", request_id), None)
            self._done_on_replica(request_id)
            if self.errored is None:
                self._send(("abort", [request_id]), replica)
            raise

    async def abort(self, request_ids: str | Sequence[str]) -> None:
        """Stop requests now: their KV blocks are free before the engine's next step, and
        their streams end with a finish_reason 'abort' output."""
        self._abort_now(request_ids)

    def _abort_now(self, request_ids: str | Sequence[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        now = time.monotonic()
        by_replica: dict[int, list[str]] = {}
        for request_id in ids:
            stream = self._streams.pop(request_id, None)
            if stream is None:
                continue
            replica = self._replica_of.get(request_id, 0)
            by_replica.setdefault(replica, []).append(request_id)
            self._done_on_replica(request_id)
            self._resolve(("add", request_id), None)  # an add still waiting returns the ended stream
            stream.put_aborted()
            for stat in self.stat_loggers:
                stat.on_finished(stream, "abort", now)
        if self.errored is None:
            for replica, some in by_replica.items():
                self._send(("abort", some), replica)

    async def scheduler_stats(self) -> SchedulerStats:
        """Fresh from the engine (answered between two steps); the replicas' merged under data parallelism."""
        return merge_stats(await self.replica_stats())

    async def replica_stats(self) -> list[SchedulerStats]:
        """Each data-parallel replica's scheduler stats, in replica order."""
        self._bind_loop()
        replies = []
        for replica in range(len(self._clients)):
            token = next(self._tokens)
            self._pending[token] = reply = self._loop.create_future()
            replies.append(reply)
            self._send(("stats", token), replica)
        return list(await asyncio.gather(*replies))

    @property
    def engine_pid(self) -> int | None:
        """The (first) engine process's id (for monitoring)."""
        return self._clients[0].pid

    @property
    def engine_pids(self) -> list[int | None]:
        """One engine process per data-parallel replica."""
        return [c.pid for c in self._clients]

    @property
    def is_running(self) -> bool:
        return self.errored is None and all(c.is_alive() for c in self._clients)

    def get_num_unfinished_requests(self) -> int:
        return len(self._streams)

    def get_num_unfinished_sequences(self) -> int:
        """Sequences (``n`` per request) of the unfinished requests: what the engine may still queue."""
        pooling = sum(1 for key in self._pending if isinstance(key, tuple) and key[0] == "pooled")
        return sum(stream.params.n for stream in self._streams.values()) + pooling

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine process; in-flight requests fail with EngineDeadError."""
        self._closing = True
        for client in self._clients:
            client.shutdown(timeout)
        self.errored = self.errored or "engine shut down"
