"""The request body's size and pace: ``serve.max_request_bytes`` and ``serve.body_timeout``.

An ASGI middleware in front of every route:

- a ``Content-Length`` above ``serve.max_request_bytes`` is a 413 at once, nothing read;
- a body sent without one (chunked) is counted as it arrives, and the route that
  reads it gets a 413 as soon as it goes past the limit;
- while the body is incomplete, each piece must arrive within ``serve.body_timeout``
  seconds, else the route gets a 408 and the connection closes (a stalled client
  holds no handler and no memory).

Both answers have the OpenAI error body. Once the body is complete, ``receive``
is passed through untimed: it then only waits for the client to disconnect.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from minivllm.serve.state import ServerState


class BodyLimits:
    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float) -> None:
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _respond(413, self._too_large(f"Content-Length is {declared} bytes"), scope, receive, send)
            return
        await self.app(scope, self._timed(receive), send)

    def _too_large(self, what: str) -> str:
        return f"body: too large ({what}); this server accepts at most serve.max_request_bytes={self.max_bytes}"

    def _timed(self, receive: Receive) -> Receive:
        received, complete = 0, False

        async def next_piece() -> Message:
            nonlocal received, complete
            if complete:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout)
            except asyncio.TimeoutError:
                detail = f"body: the next part of the request body did not arrive within serve.body_timeout={self.timeout:g} s"
                raise HTTPException(408, detail, headers={"Connection": "close"}) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > self.max_bytes:
                    raise HTTPException(413, self._too_large(f"more than {self.max_bytes} bytes were sent"))
            else:
                complete = True
            return message

        return next_piece


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _respond(code: int, message: str, scope: Scope, receive: Receive, send: Send) -> None:
    from fastapi.responses import JSONResponse

    body: dict[str, Any] = ServerState.error_body(message, "invalid_request_error", code, "body").model_dump()
    await JSONResponse(body, status_code=code, headers={"Connection": "close"})(scope, receive, send)
