"""From engine outputs to the HTTP answer: whole, or streamed as server-sent events.

A whole answer waits for the last output of each of the request's streams
(``finished``), unless the client hangs up first: then the streams are aborted
and the handler raises ``ClientDisconnected``.

A streamed answer (``stream=true``) is a 200 sent before the first token: each
chunk is one ``data: <JSON>`` event, and the stream always ends with
``data: [DONE]`` (``event_stream``). An engine that dies mid-stream can no longer
change the status, so it becomes one error event (the OpenAI error body) before
``[DONE]``. A client that hangs up cancels the stream, and ``merged``'s clean-up
aborts its requests. ``StreamUsage`` keeps the token counts ``stream_options``
asks for; ``usage`` counts them for a whole answer.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Awaitable, Iterable, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from minivllm.engine.request_stream import EngineDeadError, RequestStream
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.serve.admission import Prompt
from minivllm.serve.errors import ClientDisconnected, error_body
from minivllm.serve.protocol import UsageInfo

T = TypeVar("T")
SSE_DONE = "data: [DONE]\n\n"


async def final_outputs(streams: list[RequestStream]) -> list[RequestOutput]:
    """The last output of each stream (params with output_kind=FINAL_ONLY)."""

    async def last(stream: RequestStream) -> RequestOutput:
        async for out in stream:
            if out.finished:
                return out
        raise RuntimeError(f"{stream.request_id}: stream ended without a finished output")

    try:
        return list(await asyncio.gather(*(last(s) for s in streams)))
    finally:
        for s in streams:
            s.abort()


async def finished(request: Request, streams: list[RequestStream]) -> list[RequestOutput]:
    """The last output of each stream, unless the client hangs up first (ClientDisconnected)."""
    return await unless_disconnected(request, final_outputs(streams))


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Run ``work``; if the client hangs up first, cancel it (its ``finally`` aborts
    its requests) and raise ClientDisconnected."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # let its clean-up run; never raises
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def usage(prompts: list[Prompt], outputs: list[RequestOutput] = (), generated: int | None = None) -> UsageInfo:
    """Token counts: every prompt once, every completion's tokens (or ``generated``)."""
    n_prompt = sum(len(p.token_ids) for p in prompts)
    if generated is None:
        generated = sum(len(c.token_ids) for out in outputs for c in out.outputs)
    return UsageInfo(prompt_tokens=n_prompt, completion_tokens=generated, total_tokens=n_prompt + generated)


def sse(payload: BaseModel | dict[str, Any]) -> str:
    body = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {body}\n\n"


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    """``events`` (each made by ``sse``) as a text/event-stream response that ends with ``[DONE]``."""

    async def body() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield event
        except EngineDeadError as err:
            yield sse(error_body(str(err), "engine_error", 503))
        yield SSE_DONE

    return StreamingResponse(body(), media_type="text/event-stream")


class StreamUsage:
    """The token usage a stream reports: the counts so far on every chunk
    (``stream_options.continuous_usage_stats``), and in one last chunk without choices
    (``stream_options.include_usage``)."""

    def __init__(self, body: Any, prompts: list[Prompt]) -> None:
        options = body.stream_options
        self.every_chunk = options is not None and options.continuous_usage_stats
        """Put ``on_chunk()`` on every chunk."""
        self.at_end = options is not None and options.include_usage
        """End with a chunk that holds ``so_far()`` and no choices."""
        self.prompts = prompts
        self.generated = 0

    def count(self, outputs: Iterable[CompletionOutput]) -> None:
        """Add the tokens of one output of each completion (DELTA outputs: the new tokens)."""
        self.generated += sum(len(c.token_ids) for c in outputs)

    def so_far(self) -> UsageInfo:
        return usage(self.prompts, generated=self.generated)

    def on_chunk(self) -> UsageInfo | None:
        return self.so_far() if self.every_chunk else None


async def merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of all streams as they come, tagged with the stream's index.
    Leaving early (a client that went away) aborts every stream."""
    if len(streams) == 1:
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            streams[0].abort()
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out))
            queue.put_nowait((i, None))
        except BaseException as err:  # noqa: BLE001 - re-raised by the consumer
            queue.put_nowait((i, err))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.abort()
