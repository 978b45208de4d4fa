"""What ``AsyncLLM``'s callers wait on, and how the engine's messages reach them.

Two tables, both touched only on the event loop ``AsyncLLM`` is bound to (the
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
from typing import Any, Protocol, Sequence

from minivllm.engine.core_client import Arrival
from minivllm.engine.outputs import RequestOutput
from minivllm.engine.request_stream import RequestStream


class StatLogger(Protocol):
    """Receives per-request timings as outputs arrive (the server's metrics)."""

    def on_tokens(self, stream: RequestStream, num_new_tokens: int, now: float) -> None:
        """Called before ``stream.first_token_time``/``last_token_time`` move to ``now``."""

    def on_finished(self, stream: RequestStream, finish_reason: str, now: float) -> None: ...


class AsyncRequests:
    def __init__(self, stat_loggers: Sequence[StatLogger] = ()) -> None:
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

    def deliver(self, arrival: Arrival, now: float) -> None:
        """Hand one engine message's contents to the streams and futures waiting for them."""
        for request_id in arrival.added:
            self.resolve(("add", request_id), None)
        for request_id, reason in arrival.refused.items():
            self.streams.pop(request_id, None)
            self.resolve(("add", request_id), ValueError(reason))
        for token, value in arrival.replies.items():
            self.resolve(token, value)
        for out in arrival.outputs:
            self._on_output(out, now)
        for pooled in arrival.pooled:
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
