"""``AsyncLLM``: the engine for online serving, driven from asyncio.

::

    engine = AsyncLLM.from_kwargs("path/to/hf_dir", dtype="float32")
    async for out in engine.generate("Hello", SamplingParams(max_tokens=8), "req-1"):
        print(out.outputs[0].text)
    await engine.abort("req-2")   # frees its KV blocks before the next step

The ``LLMEngine`` steps in its own process (``engine/engine_proc.py``); this
object lives on the caller's event loop. It tokenizes and validates each request
itself, once (``Processor.process``, the same rules as ``LLM``), so a bad request
raises ValueError before anything reaches the engine, which queues the processed
request as it is. ``EngineCoreClient`` (``engine/core_client.py``) starts the
engine and hands its messages to the event loop, where each request's
``RequestStream`` receives its outputs and each awaited reply its future
(``request_stream.py``: what callers wait on, and how a message reaches it).
This file binds the event loop, admits and aborts requests, and asks the engine.

With ``parallel.dp > 1`` there is one engine process per data-parallel
replica (a Ray actor each, on any node, with ``parallel.dp_backend=ray``:
``ray_replica.py``; the same messages arrive the same way), and each request goes
to the replica ``LoadBalancer`` picks (fewest unfinished requests; the one holding
its prefix when prefix caching is on). A replica that dies fails every request
and makes the engine dead (``errored`` names the replica), as one engine process's death does.

One ``AsyncLLM`` serves one event loop at a time; call ``shutdown()`` when done.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from typing import Any, AsyncIterator, Callable, Sequence

from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler import SchedulerStats
from minivllm.engine.balancer import LoadBalancer
from minivllm.engine.core_client import EngineCoreClient, merge_stats
from minivllm.engine.messages import Call, EngineFailed, EngineOutputs, GetStats, IsSleeping, Sleep, WakeUp
from minivllm.engine.processor import ProcessedRequest, Processor
from minivllm.engine.request_stream import AsyncRequests, EngineDeadError, RequestStatLogger, RequestStream
from minivllm.inputs import PromptType
from minivllm.lora_request import LoRARequest
from minivllm.outputs import PoolingRequestOutput, RequestOutput
from minivllm.plugins import load_general_plugins
from minivllm.pooling.params import PoolingParams
from minivllm.sampling_params import RequestOutputKind, SamplingParams


class AsyncLLM:
    def __init__(self, cfg: VllmConfig, stat_loggers: Sequence[RequestStatLogger] = ()) -> None:
        self.cfg = cfg
        self._requests = AsyncRequests(stat_loggers)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.client = EngineCoreClient(cfg, self._from_engine, self._engine_exited)
        self.tokenizer = self.client.tokenizer
        self.processor: Processor = self.client.processor
        self.num_kv_blocks = self.client.num_kv_blocks

    @property
    def errored(self) -> str | None:
        """Why the engine stopped, once it has."""
        return self.client.failure

    @property
    def stat_loggers(self) -> list[RequestStatLogger]:
        """The loggers told of each request's tokens and end (add and remove them here)."""
        return self._requests.stat_loggers

    @property
    def balancer(self) -> LoadBalancer:
        return self.client.balancer

    @classmethod
    def from_kwargs(cls, model: str | None = None, **kwargs: Any) -> "AsyncLLM":
        """Same keywords as ``LLM(model, ...)``."""
        tree = config_from_kwargs(model, **kwargs)
        load_general_plugins(tree.get("plugins"))  # before the config checks the architecture a plugin may add
        return cls(VllmConfig.from_dictconfig(tree))

    # ---- the engine process ----------------------------------------------------------
    def _from_engine(self, replica: int, msg: EngineOutputs | EngineFailed, now: float) -> None:
        self._call_in_loop(self._on_message, replica, msg, now)  # (on the reader thread)

    def _engine_exited(self, replica: int, reason: str) -> None:
        if not self._call_in_loop(self._on_exit, replica, reason):
            self.client.fail(replica, reason)  # no loop to tell: nothing waits

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

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._requests.streams or self._requests.pending:
                raise RuntimeError("AsyncLLM: in use by requests on another event loop")
            self._loop = loop

    # ---- messages from the engine (on the event loop) ---------------------------------
    def _on_message(self, replica: int, msg: EngineOutputs | EngineFailed, now: float) -> None:
        received = self.client.receive(replica, msg)
        self._requests.deliver(received, now)
        if received.failure is not None:
            self._on_dead()

    def _on_exit(self, replica: int, reason: str) -> None:
        self.client.fail(replica, reason)
        self._on_dead()

    def _on_dead(self) -> None:
        """Fail every stream and waiting call with the client's recorded failure."""
        self._requests.fail_all(EngineDeadError(self.errored))

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
        self.client.check_alive()
        return await self.add_processed(self.process(request_id, prompt, params, priority, group_id, lora_request))

    def process(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | PoolingParams | None = None,
        priority: int = 0,
        group_id: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> ProcessedRequest:
        """The checks and tokenization of ``add_request`` (or ``encode``, with PoolingParams), done once
        (``Processor.process``); queues nothing. Raises ValueError naming the field."""
        return self.processor.process(
            str(request_id), prompt, params, lora_request=lora_request, priority=priority, group_id=group_id
        )

    async def add_processed(self, request: ProcessedRequest) -> RequestStream:
        """Queue a request ``process`` made (nothing is checked or tokenized again, here or in the
        engine); returns its stream once the engine has accepted it. Raises ValueError if its id
        is in use by an unfinished request, EngineDeadError if the engine is gone."""
        self._bind_loop()
        if request.pooling_params is not None:
            raise ValueError("pooling_params: a pooling request returns one vector; use encode()")
        params = request.params
        sent = copy.copy(params)  # a shallow copy, pickled to the engine: the stream makes what ``params`` asks for
        sent.output_kind = RequestOutputKind.DELTA
        self.client.add(dataclasses.replace(request, params=sent))
        stream = RequestStream(
            request.request_id, request.prompt, request.prompt_token_ids, params, self._abort_now, time.monotonic()
        )
        self._requests.streams[request.request_id] = stream
        accepted = self._requests.expect(("add", request.request_id), self._loop)
        try:
            await accepted
        except asyncio.CancelledError:
            self._abort_now(request.request_id)
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
        self,
        prompt: PromptType,
        params: PoolingParams,
        request_id: str,
        priority: int = 0,
        group_id: str | None = None,
    ) -> PoolingRequestOutput:
        """The pooled vector of one prompt (model.runner=pooling). Raises ValueError (nothing queued)
        on bad input; cancelling the await aborts the request. ``group_id`` as for ``add_request``."""
        self._bind_loop()
        self.client.check_alive()
        return await self.encode_processed(self.process(request_id, prompt, params, priority, group_id))

    async def encode_processed(self, request: ProcessedRequest) -> PoolingRequestOutput:
        """``encode`` of a pooling request ``process`` made (not checked or tokenized again)."""
        self._bind_loop()
        if request.pooling_params is None:
            raise ValueError("params: encode() needs PoolingParams; generate with add_request()")
        request_id = request.request_id
        self.client.add(request)
        accepted = self._requests.expect(("add", request_id), self._loop)
        pooled = self._requests.expect(("pooled", request_id), self._loop)
        try:
            await accepted
            return await pooled
        except BaseException:
            self._requests.pending.pop(("pooled", request_id), None)
            self.client.abort([request_id])
            raise

    async def abort(self, request_ids: str | Sequence[str]) -> None:
        """Stop requests now: their KV blocks are free before the engine's next step, and
        their streams end with a finish_reason 'abort' output."""
        self._abort_now(request_ids)

    def _abort_now(self, request_ids: str | Sequence[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        now = time.monotonic()
        streams = self._requests.pop_streams(ids)
        self.client.abort([r for r, _ in streams])
        self._requests.end_aborted(streams, now)

    def fail_requests(self, err: BaseException) -> int:
        """End every unfinished request now: its consumer raises ``err`` (a server shutting down
        tells its clients why) and the engine frees its KV blocks. Returns how many there were."""
        ids = self._requests.fail_streams(err)
        self._abort_now(ids)
        return len(ids) + self._requests.fail_waiting(err)

    async def scheduler_stats(self) -> SchedulerStats:
        """Fresh from the engine (answered between two steps); the replicas' merged under data parallelism."""
        return merge_stats(await self.replica_stats())

    async def replica_stats(self) -> list[SchedulerStats]:
        """Each data-parallel replica's scheduler stats, in replica order."""
        return await self._ask_engines(GetStats)

    # ---- sleep mode (every replica; LLMEngine.sleep) ------------------------------------
    async def sleep(self, level: int = 1) -> None:
        """Free the KV cache and offload (1) or discard (2) the weights; ValueError while requests run."""
        await self._ask_engines(lambda token: Sleep(token, level))

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await self._ask_engines(lambda token: WakeUp(token, tags))

    async def is_sleeping(self) -> bool:
        return any(await self._ask_engines(IsSleeping))

    async def _ask_engines(self, command: Callable[[int], Call]) -> list[Any]:
        """Send ``command(token)`` to every replica's engine; their replies in replica order."""
        self._bind_loop()
        tokens = self.client.ask_all(command)
        return list(await asyncio.gather(*self._requests.replies(tokens, self._loop)))

    @property
    def engine_pid(self) -> int | None:
        """The (first) engine process's id (for monitoring)."""
        return self.client.pids[0]

    @property
    def engine_pids(self) -> list[int | None]:
        """One engine process per data-parallel replica (its actor's process with ``dp_backend=ray``)."""
        return self.client.pids

    @property
    def is_running(self) -> bool:
        return self.client.is_running

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests.streams)

    def get_num_unfinished_sequences(self) -> int:
        """Sequences (``n`` per request) of the unfinished requests: what the engine may still queue."""
        return self._requests.num_unfinished_sequences()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine process; in-flight requests fail with EngineDeadError."""
        self.client.shutdown(timeout)
