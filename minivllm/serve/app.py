"""The FastAPI app: OpenAI-compatible routes over an ``AsyncLLM``.

    app = build_app(AsyncLLM(cfg), cfg)     # then uvicorn.run(app) or serve/cli.py

Every bad request is a 400 with an OpenAI-style body naming the field
(``{"error": {"message", "type", "param", "code"}}``); the engine never sees it.
An unknown model is a 404 (``NotFoundError``), a full queue or a dead engine a
503 with ``Retry-After`` (one line, never a traceback); a client that hangs up
gets its requests aborted and one log line. A body over ``serve.max_request_bytes``
is a 413, a stalled one a 408 (``body_limits.py``). Only a server bug is a 500.
With ``serve.api_key`` set, each /v1 route wants ``Authorization: Bearer <key>``.
/openapi.json documents all of it (``openapi.py``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.request_stream import EngineDeadError, one_line
from minivllm.serve.body_limits import BodyLimits
from minivllm.serve.chat import create_chat_completion
from minivllm.serve.completions import create_completion
from minivllm.serve.dev_routes import add_dev_routes
from minivllm.serve.embeddings import add_embedding_routes
from minivllm.serve.errors import DEAD_ENGINE_RETRY_AFTER_S, ClientDisconnected, ModelNotFound, Overloaded
from minivllm.serve.lora_routes import add_lora_routes
from minivllm.serve.metrics import CONTENT_TYPE
from minivllm.serve.models_route import add_model_routes
from minivllm.serve.openapi import install_openapi
from minivllm.serve.params import BadRequest, param_of
from minivllm.serve.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
)
from minivllm.serve.protocol.ranges import out_of_range as range_message
from minivllm.serve.state import ServerState
from minivllm.serve.tokenize import add_tokenize_routes
from minivllm.serve.tokenizer_info import add_tokenizer_info_route

logger = logging.getLogger(__name__)
ROUTES = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/health",
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/tokenizer_info",
    "/v1/embeddings",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
)


def build_app(engine: AsyncLLM, cfg: VllmConfig) -> FastAPI:
    state = ServerState(engine, cfg)
    app = FastAPI(title="minivllm", summary="OpenAI-compatible server", docs_url=None, redoc_url=None)
    app.state.server = state
    _add_error_handlers(app, state)
    _add_routes(app, state)
    add_tokenize_routes(app, state)
    add_tokenizer_info_route(app, state)
    add_embedding_routes(app, state)
    install_openapi(app, api_key_set=state.api_key is not None)
    serve = cfg.serve
    app.add_middleware(BodyLimits, max_bytes=serve.max_request_bytes, timeout=serve.body_timeout)
    app.add_middleware(_Auth, api_key=state.api_key)
    app.add_middleware(_HttpMetrics, state=state)
    return app


def dead_engine_error(reason: str | None) -> JSONResponse:
    """The 503 for a dead engine: one line, never a traceback, and when to come back."""
    message = one_line(reason or "engine is not running")
    return _error(message, "engine_error", 503, headers={"Retry-After": str(DEAD_ENGINE_RETRY_AFTER_S)})


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/completions", response_model=None, responses={200: {"model": CompletionResponse}})
    async def completions(body: CompletionRequest, raw: Request) -> Any:
        return await create_completion(state, body, raw)

    @app.post("/v1/chat/completions", response_model=None, responses={200: {"model": ChatCompletionResponse}})
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Any:
        return await create_chat_completion(state, body, raw)

    add_model_routes(app, state)

    if state.cfg.serve.enable_lora_runtime_updates:
        add_lora_routes(app, state)
    if state.cfg.serve.dev_mode:
        add_dev_routes(app, state)

    @app.get("/health", response_class=Response)
    async def health() -> Response:
        if not state.engine.is_running:
            return dead_engine_error(state.engine.errored)
        return Response(status_code=200)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        try:
            stats = await asyncio.wait_for(state.engine.scheduler_stats(), timeout=5.0)
        except (EngineDeadError, asyncio.TimeoutError):
            stats = None  # serve the last known engine numbers
        return Response(state.metrics.render(stats), media_type=CONTENT_TYPE)


def _error(
    message: str, kind: str, code: int, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ServerState.error_body(message, kind, code, param)
    return JSONResponse(body.model_dump(), status_code=code, headers=headers)


def _add_error_handlers(app: FastAPI, state: ServerState) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _wrong_content_type(request) or _describe_validation(exc.errors())
        return _error(message, "invalid_request_error", 400, param)

    @app.exception_handler(ModelNotFound)
    async def no_model(_: Request, exc: ModelNotFound) -> JSONResponse:
        return _error(str(exc), "NotFoundError", 404, exc.param)

    @app.exception_handler(Overloaded)
    async def overloaded(_: Request, exc: Overloaded) -> JSONResponse:
        return _error(str(exc), "ServiceUnavailableError", 503, headers={"Retry-After": str(exc.retry_after)})

    @app.exception_handler(ClientDisconnected)
    async def gone(request: Request, _: ClientDisconnected) -> Response:
        logger.info("%s: the client disconnected before the answer; its requests were aborted", request.url.path)
        return Response(status_code=ClientDisconnected.STATUS)

    @app.exception_handler(BadRequest)
    async def bad(_: Request, exc: BadRequest) -> JSONResponse:
        return _error(str(exc), "invalid_request_error", 400, exc.param)

    @app.exception_handler(ValueError)
    async def value_error(_: Request, exc: ValueError) -> JSONResponse:
        return _error(str(exc), "invalid_request_error", 400, param_of(str(exc)))

    @app.exception_handler(EngineDeadError)
    async def dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return dead_engine_error(str(exc))

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error")
        return _error(f"internal error: {type(exc).__name__}: {exc}", "internal_error", 500)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        param = "body" if exc.status_code in (408, 413) else None
        return _error(str(exc.detail), kind, exc.status_code, param, headers=exc.headers)  # keeps a 405's Allow


def _wrong_content_type(request: Request) -> tuple[str, None] | None:
    """The complaint for a body FastAPI did not parse as JSON because of its Content-Type."""
    given = request.headers.get("content-type")
    media = (given or "").split(";")[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return None
    sent = f"got {given!r}" if given else "none was sent"
    return f"body: Content-Type must be application/json ({sent})", None


def _describe_validation(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(message, param) for pydantic's first complaint."""
    err = errors[0]
    if err.get("type") == "json_invalid":
        return f"body: malformed JSON ({err.get('ctx', {}).get('error', err['msg'])})", None
    loc = [str(part) for part in err.get("loc", ()) if part != "body"]
    if not loc:
        return f"body: {err['msg']}; expected a JSON object", None
    param = loc[0]
    where = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc[1:])
    if err.get("type") == "extra_forbidden":
        what = "request field" if not where else "field"
        return f"{param}{where}: unknown or unsupported {what}; this server does not implement it", param
    out_of_range = range_message(err, param, where)
    if out_of_range is not None:
        return out_of_range, param
    detail = f" (at {param}{where})" if where else ""
    return f"{param}: {_own_words(err)}{detail}", param


def _own_words(err: dict[str, Any]) -> str:
    """A validator's own message, without the "Value error, " pydantic puts before it."""
    raised = err.get("ctx", {}).get("error") if err.get("type") == "value_error" else None
    return str(raised) if raised is not None else err["msg"]


class _Auth:
    """401 on /v1 routes without ``Authorization: Bearer <api_key>`` (when a key is set)."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected and scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                msg = "invalid or missing API key; send the header 'Authorization: Bearer <serve.api_key>'"
                await _error(msg, "authentication_error", 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _HttpMetrics:
    """Counts responses by route and status for /metrics."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_and_note(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = scope["path"] if scope["path"] in ROUTES else "other"
            self.state.metrics.record_http(route, status)
