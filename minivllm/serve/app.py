"""The FastAPI app: every route of the OpenAI-compatible server over an ``AsyncLLM``,
and what each request passes through before its route.

    app = build_app(AsyncLLM(cfg), cfg)     # then server.make_server(app, cfg).run(...)

Routes, by family (the big handlers live in their own modules):

- generation: ``/v1/completions`` (``completions.py``), ``/v1/chat/completions``
  (``chat.py``), ``/v1/embeddings`` (``embeddings.py``);
- models: ``/v1/models``, ``/v1/models/{id}`` (every served name of the base model,
  then each LoRA adapter; an id not served is a 404), and with
  ``serve.enable_lora_runtime_updates`` ``/v1/load_lora_adapter`` and
  ``/v1/unload_lora_adapter``: a loaded adapter is checked (files, rank, target
  modules, shapes) before it is served, a bad one is a 400 and nothing changes;
  unloading an unknown name is a 404;
- tokenizer: ``/tokenize``, ``/detokenize``, ``/tokenizer_info`` (``tokenize.py``);
- status: ``/health``, ``/ping`` (vLLM's), ``/version``, ``/metrics`` (``metrics.py``);
- development (``serve.dev_mode``, vLLM's ``VLLM_SERVER_DEV_MODE``): sleep mode over HTTP.
  ``POST /sleep?level=1`` frees the KV cache and offloads (1) or discards (2) the
  weights, ``POST /wake_up?tags=weights`` brings back "weights" and/or "kv_cache"
  (repeat ``tags``; none: both), ``GET /is_sleeping``. They let anyone who reaches
  the port take the model's memory away, so they exist only when asked for; a
  refusal (sleep mode off, requests running, a bad level or tag) is a 400 naming
  the parameter, and the engine keeps serving.

Before a route (ASGI middlewares, outermost first): ``HttpMetrics`` counts responses
by route and status; ``Auth`` wants ``Authorization: Bearer <key>`` on each /v1 route
when ``serve.api_key`` is set (401 otherwise); ``BodyLimits`` bounds the body's size
and pace. Errors and their statuses: ``errors.py``; /openapi.json: ``openapi.py``.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import minivllm
from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.request_stream import EngineDeadError
from minivllm.serve.chat import create_chat_completion
from minivllm.serve.completions import create_completion
from minivllm.serve.embeddings import create_embedding
from minivllm.serve.errors import (
    DEAD_ENGINE_RETRY_AFTER_S,
    BadRequest,
    ModelNotFound,
    add_error_handlers,
    dead_engine_error,
    error_response,
)
from minivllm.serve.metrics import CONTENT_TYPE
from minivllm.serve.openapi import install_openapi
from minivllm.serve.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    LoadLoRAAdapterRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfoResponse,
    UnloadLoRAAdapterRequest,
)
from minivllm.serve.state import OPEN_PATHS, ServerState
from minivllm.serve.tokenize import create_detokenize, create_tokenize, tokenizer_info

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
"""The routes /metrics counts by name; any other path is counted as ``other``."""


def build_app(engine: AsyncLLM, cfg: VllmConfig) -> FastAPI:
    state = ServerState(engine, cfg)
    app = FastAPI(title="minivllm", summary="OpenAI-compatible server", docs_url=None, redoc_url=None)
    app.state.server = state
    add_error_handlers(app)
    _add_generation_routes(app, state)
    _add_model_routes(app, state)
    if cfg.serve.enable_lora_runtime_updates:
        _add_lora_routes(app, state)
    if cfg.serve.dev_mode:
        _add_dev_routes(app, state)
    _add_status_routes(app, state)
    _add_tokenizer_routes(app, state)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, raw: Request) -> EmbeddingResponse:
        return await create_embedding(state, body, raw)

    install_openapi(app, api_key_set=state.api_key is not None)
    serve = cfg.serve
    app.add_middleware(BodyLimits, max_bytes=serve.max_request_bytes, timeout=serve.body_timeout)
    app.add_middleware(Auth, api_key=state.api_key)
    app.add_middleware(HttpMetrics, state=state)
    return app


def _add_generation_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/completions", response_model=None, responses={200: {"model": CompletionResponse}})
    async def completions(body: CompletionRequest, raw: Request) -> Any:
        return await create_completion(state, body, raw)

    @app.post("/v1/chat/completions", response_model=None, responses={200: {"model": ChatCompletionResponse}})
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Any:
        return await create_chat_completion(state, body, raw)


def _add_model_routes(app: FastAPI, state: ServerState) -> None:
    """GET /v1/models and GET /v1/models/{id} (the openai client's ``models.list`` and ``models.retrieve``)."""

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=state.model_cards())

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> ModelCard:
        cards = state.model_cards()
        card = next((c for c in cards if c.id == model_id), None)
        if card is None:
            raise ModelNotFound(model_id, ", ".join(c.id for c in cards))
        return card


def _add_lora_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/load_lora_adapter")
    async def load(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        try:
            state.adapters.load(body.lora_name, body.lora_path)
        except ValueError as err:
            raise BadRequest("lora_path", str(err)) from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        try:
            state.adapters.unload(body.lora_name)
        except KeyError:
            raise ModelNotFound(body.lora_name, ", ".join(state.adapters.by_name) or "no adapters") from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def _add_dev_routes(app: FastAPI, state: ServerState) -> None:
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


def _add_status_routes(app: FastAPI, state: ServerState) -> None:
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


def _add_tokenizer_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        return await create_tokenize(state, body)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        return create_detokenize(state, body)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": minivllm.__version__}

    @app.api_route("/ping", methods=["GET", "POST"], response_class=Response)
    async def ping() -> Response:
        if state.engine.is_running:
            return Response(status_code=200)
        return Response(status_code=503, headers={"Retry-After": str(DEAD_ENGINE_RETRY_AFTER_S)})

    info = tokenizer_info(state)  # fixed for the server's life

    @app.get("/tokenizer_info")
    async def get_tokenizer_info() -> TokenizerInfoResponse:
        return info


class Auth:
    """401 on every route but ``OPEN_PATHS`` without ``Authorization: Bearer <api_key>`` (when a key is set)."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected and scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                msg = "invalid or missing API key; send the header 'Authorization: Bearer <serve.api_key>'"
                await error_response(msg, "authentication_error", 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class HttpMetrics:
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


class BodyLimits:
    """The request body's size and pace: ``serve.max_request_bytes`` and ``serve.body_timeout``.

    - a ``Content-Length`` above ``serve.max_request_bytes`` is a 413 at once, nothing read;
    - a body sent without one (chunked) is counted as it arrives, and the route that
      reads it gets a 413 as soon as it goes past the limit;
    - while the body is incomplete, each piece must arrive within ``serve.body_timeout``
      seconds, else the route gets a 408 and the connection closes (a stalled client
      holds no handler and no memory).

    Both answers have the OpenAI error body. Once the body is complete, ``receive``
    is passed through untimed: it then only waits for the client to disconnect.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float) -> None:
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            message = self._too_large(f"Content-Length is {declared} bytes")
            answer = error_response(message, "invalid_request_error", 413, "body", headers={"Connection": "close"})
            await answer(scope, receive, send)
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
