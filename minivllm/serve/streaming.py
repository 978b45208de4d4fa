"""Server-sent events: how completions and chat stream (``stream=true``).

A streamed answer is a 200 sent before the first token: each chunk is one
``data: <JSON>`` event, and the stream always ends with ``data: [DONE]``
(``event_stream``). An engine that dies mid-stream can no longer change the
status, so it becomes one error event (the OpenAI error body) before ``[DONE]``.
A client that hangs up cancels the stream, and ``merged``'s clean-up aborts its
requests. ``StreamUsage`` keeps the token counts ``stream_options`` asks for.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Iterable

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from minivllm.engine.request_stream import EngineDeadError, RequestStream
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.serve.generation import Prompt, usage
from minivllm.serve.protocol import UsageInfo
from minivllm.serve.state import ServerState

SSE_DONE = "data: [DONE]\n\n"


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
            yield sse(ServerState.error_body(str(err), "engine_error", 503))
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
