"""What ``AsyncLLM``'s callers wait on: each request's ``RequestStream``, and the
tables (``AsyncRequests``) through which the engine's messages reach them.

The engine process always sends deltas. A stream turns them into what the
request's ``SamplingParams.output_kind`` asks for (deltas, everything so far, or
only the final output) and hands them to one consumer through an asyncio queue.
A consumer that stops early (a client that went away) calls ``abort()``.

``AsyncRequests`` holds two tables, both touched only on the event loop ``AsyncLLM`` is bound to (the
threads that read the engine processes hand each message over with
``call_soon_threadsafe``), so nothing here takes a lock:

- ``streams``: each unfinished generate request's ``RequestStream``, from the moment
  it is queued until its finished output, its abort or the engine's death. An output
  whose request has no stream (aborted meanwhile) is dropped.
- ``pending``: the futures callers await, by key: ``("add", id)`` resolves once the
  engine accepted (None) or refused (ValueError) the request, or at once when it is
  aborted first (an ``add_request`` still waiting then returns the ended stream);
  ``("pooled", id)`` is a pooling request's output; an ``int`` is the token of a
  reply to ``EngineCoreClient.ask_all``.

Stat loggers hear of each request's new tokens before its stream's token times move,
and of its end once (finished or aborted); a dead engine fails every stream and future
with the same ``EngineDeadError`` and tells them nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Callable, Protocol, Sequence

from minivllm.engine.messages import EngineOutputs
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import RequestOutputKind, SamplingParams


class EngineDeadError(RuntimeError):
    """The engine process failed or exited; no request can make progress.

    ``str(err)`` is one line (what a client may be shown); ``detail`` keeps the
    whole report, a worker's traceback included (the engine client logs it once)."""

    def __init__(self, reason: str | None = None) -> None:
        self.detail = reason or "engine is not running"
        super().__init__(one_line(self.detail))


def one_line(reason: str) -> str:
    """A failure report without its traceback: its first words and its last line
    (``engine failed: Traceback ... RuntimeError: x`` -> ``engine failed: RuntimeError: x``)."""
    lines = [line.strip() for line in reason.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else reason
    head = lines[0].split("Traceback (most recent call last)")[0].strip()
    return f"{head} {lines[-1]}" if head and head != lines[-1] else lines[-1]


class RequestStream:
    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        abort: Callable[[str], None],
        arrival_time: float,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.arrival_time = arrival_time
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.num_generation_tokens = 0
        self.finished = False
        """The engine reported the last output (or the request was aborted)."""
        self._abort = abort
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._so_far: dict[int, CompletionOutput] = {}
        self._indices: set[int] = set()
        self._done = False
        self._prompt_logprobs = None
        """Sent by the engine with the first delta only; kept for CUMULATIVE and FINAL_ONLY outputs."""

    # ---- producer side (the AsyncLLM's event loop) -------------------------------------
    def put(self, delta: RequestOutput) -> None:
        """Take one delta from the engine; queue what the consumer should see."""
        delta.prompt, delta.prompt_token_ids = self.prompt, self.prompt_token_ids
        delta.metrics = self._metrics(delta.finished)
        self.finished = delta.finished
        self._indices.update(c.index for c in delta.outputs)
        kind = self.params.output_kind
        if kind == RequestOutputKind.DELTA:
            self._queue.put_nowait(delta)
            return
        self._prompt_logprobs = delta.prompt_logprobs or self._prompt_logprobs
        for c in delta.outputs:
            self._merge(c)
        if kind == RequestOutputKind.FINAL_ONLY and not delta.finished:
            return
        outputs = [_copy(self._so_far[i]) for i in sorted(self._so_far)]
        self._queue.put_nowait(dataclasses.replace(delta, outputs=outputs, prompt_logprobs=self._prompt_logprobs))

    def _merge(self, c: CompletionOutput) -> None:
        acc = self._so_far.get(c.index)
        if acc is None:
            self._so_far[c.index] = _copy(c)
            return
        acc.text += c.text
        acc.token_ids.extend(c.token_ids)
        if c.logprobs is not None:
            acc.logprobs = (acc.logprobs or []) + list(c.logprobs)
        if c.cumulative_logprob is not None:
            acc.cumulative_logprob = c.cumulative_logprob
        acc.finish_reason, acc.stop_reason = c.finish_reason, c.stop_reason

    def put_aborted(self) -> None:
        """End the stream: a last output, finished, with finish_reason 'abort'."""
        if self.finished:
            return
        ends = [CompletionOutput(i, "", [], None, None, finish_reason="abort") for i in sorted(self._indices) or [0]]
        self.put(RequestOutput(self.request_id, None, [], ends, finished=True))

    def _metrics(self, finished: bool) -> dict[str, float]:
        metrics = {"arrival_time": self.arrival_time, "first_token_time": self.first_token_time or 0.0}
        if finished:
            metrics["finished_time"] = self.last_token_time or self.arrival_time
        return metrics

    def fail(self, err: BaseException) -> None:
        self.finished = True
        self._queue.put_nowait(err)

    # ---- consumer side ---------------------------------------------------------------
    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        """The next output; StopAsyncIteration after the finished one."""
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._done = item.finished
        return item

    def abort(self) -> None:
        """Stop the request if it is still running (frees its KV blocks); a consumer
        still iterating gets a last output with finish_reason 'abort'."""
        if not self.finished:
            self._abort(self.request_id)


def _copy(c: CompletionOutput) -> CompletionOutput:
    return dataclasses.replace(
        c, token_ids=list(c.token_ids), logprobs=list(c.logprobs) if c.logprobs is not None else None
    )


class RequestStatLogger(Protocol):
    """Receives per-request timings as outputs arrive (the server's metrics)."""

    def on_tokens(self, stream: RequestStream, num_new_tokens: int, now: float) -> None:
        """Called before ``stream.first_token_time``/``last_token_time`` move to ``now``."""

    def on_finished(self, stream: RequestStream, finish_reason: str, now: float) -> None: ...


class AsyncRequests:
    def __init__(self, stat_loggers: Sequence[RequestStatLogger] = ()) -> None:
        self.stat_loggers = list(stat_loggers)
        """Callers may add and remove loggers at any time (the server adds its metrics)."""
        self.streams: dict[str, RequestStream] = {}
        self.pending: dict[Any, asyncio.Future] = {}

    def expect(self, key: Any, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """A new future for ``key`` (``("add", id)`` or ``("pooled", id)``)."""
        fut = self.pending[key] = loop.create_future()
        return fut

    def replies(self, tokens: list[int], loop: asyncio.AbstractEventLoop) -> list[asyncio.Future]:
        """The futures of the replies ``ask_all`` handed out ``tokens`` for, in its order."""
        return [self.pending.setdefault(token, loop.create_future()) for token in tokens]

    def deliver(self, received: EngineOutputs, now: float) -> None:
        """Hand one engine message's contents to the streams and futures waiting for them."""
        for request_id in received.added:
            self.resolve(("add", request_id), None)
        for request_id, reason in received.refused.items():
            self.streams.pop(request_id, None)
            self.resolve(("add", request_id), ValueError(reason))
        for token, value in received.replies.items():
            self.resolve(token, value)
        for out in received.outputs:
            self._on_output(out, now)
        for pooled in received.pooled:
            self.resolve(("pooled", pooled.request_id), pooled)

    def resolve(self, key: Any, value: Any) -> None:
        fut = self.pending.pop(key, None)
        if fut is None or fut.done():
            return
        if isinstance(value, BaseException):
            fut.set_exception(value)
        else:
            fut.set_result(value)

    def _on_output(self, out: RequestOutput, now: float) -> None:
        stream = self.streams.get(out.request_id)
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
            del self.streams[out.request_id]
            reason = next((c.finish_reason for c in out.outputs if c.finish_reason), "stop")
            for stat in self.stat_loggers:
                stat.on_finished(stream, reason, now)

    def pop_streams(self, request_ids: list[str]) -> list[tuple[str, RequestStream]]:
        """Stop tracking those of ``request_ids`` that have a stream; returns them."""
        return [(r, s) for r in request_ids if (s := self.streams.pop(r, None)) is not None]

    def end_aborted(self, streams: list[tuple[str, RequestStream]], now: float) -> None:
        """End the streams ``pop_streams`` returned with an 'abort' output."""
        for request_id, stream in streams:
            self.resolve(("add", request_id), None)  # an add still waiting returns the ended stream
            stream.put_aborted()
            for stat in self.stat_loggers:
                stat.on_finished(stream, "abort", now)

    def fail_streams(self, err: BaseException) -> list[str]:
        """Make each stream's consumer raise ``err`` (the streams stay tracked); returns their ids."""
        ids = list(self.streams)
        for request_id in ids:
            self.streams[request_id].fail(err)
        return ids

    def fail_waiting(self, err: BaseException) -> int:
        """Fail the futures of requests (``add`` and ``pooled``) with ``err``; returns how many
        pooling requests that ended."""
        pending = [key for key in self.pending if isinstance(key, tuple) and key[0] in ("add", "pooled")]
        for key in pending:
            fut = self.pending.pop(key)
            if not fut.done():
                fut.set_exception(err)
        return sum(1 for key in pending if key[0] == "pooled")

    def fail_all(self, err: BaseException) -> None:
        """The engine is gone: every stream and every future (replies included) fails with ``err``."""
        for stream in self.streams.values():
            stream.fail(err)
        self.streams.clear()
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(err)
        self.pending.clear()

    def num_unfinished_sequences(self) -> int:
        """Sequences (``n`` per request) of the unfinished requests, pooling requests included."""
        pooling = sum(1 for key in self.pending if isinstance(key, tuple) and key[0] == "pooled")
        return sum(stream.params.n for stream in self.streams.values()) + pooling
