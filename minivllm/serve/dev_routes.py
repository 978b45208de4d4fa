"""Development routes (``serve.dev_mode``, vLLM's ``VLLM_SERVER_DEV_MODE``): sleep mode over HTTP.

    POST /sleep?level=1            free the KV cache, offload (1) or discard (2) the weights
    POST /wake_up?tags=weights     bring back "weights" and/or "kv_cache" (repeat ``tags``; none: both)
    GET  /is_sleeping              {"is_sleeping": true|false}

They let anyone who reaches the port take the model's memory away, so they exist only
when asked for. A refusal (sleep mode off, requests running, a bad level or tag) is a
400 naming the parameter; the engine keeps serving.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Query
from fastapi.responses import JSONResponse, Response

from minivllm.serve.params import BadRequest
from minivllm.serve.state import ServerState


def add_dev_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/sleep")
    async def sleep(level: int = 1) -> Response:
        try:
            await state.engine.sleep(level)
        except ValueError as err:
            raise BadRequest("level", str(err)) from None
        return Response(status_code=200)

    @app.post("/wake_up")
    async def wake_up(tags: Annotated[list[str] | None, Query()] = None) -> Response:
        try:
            await state.engine.wake_up(tags)
        except ValueError as err:
            raise BadRequest("tags", str(err)) from None
        return Response(status_code=200)

    @app.get("/is_sleeping")
    async def is_sleeping() -> JSONResponse:
        return JSONResponse({"is_sleeping": await state.engine.is_sleeping()})
