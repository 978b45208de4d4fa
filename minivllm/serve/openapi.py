"""``/openapi.json`` that tells the truth about every route.

FastAPI documents a 422 for every route with a body, JSON for every answer,
and no error the handlers raise. This rewrites what it generates, route by
route (``ROUTES``):

- the statuses a route can answer, each error with the OpenAI body
  (``ErrorResponse``): 400, 404, 408, 413, 503 (with ``Retry-After``), and 401
  on every route but ``state.OPEN_PATHS`` when ``serve.api_key`` is set; never 422 (the server has none);
- the media types: ``text/event-stream`` beside JSON for the generation routes,
  ``text/plain`` for /metrics and the LoRA routes, no body at all for /health's
  and /ping's 200.

Request bodies already forbid unknown fields (``protocol.OpenAIModel``), which
the generated schemas state as ``additionalProperties: false``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from minivllm.serve.protocol import ErrorResponse
from minivllm.serve.state import OPEN_PATHS

ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
EVENT_STREAM = {
    "schema": {  # one event (OpenAPI 3.1 reads an event stream's schema per event)
        "type": "object",
        "properties": {"data": {"type": "string", "description": "a chunk as JSON, an error as JSON, or [DONE]"}},
        "required": ["data"],
    },
    "description": "with stream=true: server-sent events, `data: <chunk JSON>` each, then `data: [DONE]`",
}
MEANING = {
    "400": "A field or parameter is missing, unknown, of the wrong type or out of range (the message and `param` name it)",
    "401": "Missing or wrong API key (`Authorization: Bearer <serve.api_key>`)",
    "404": "The `model` (or adapter) is not served here",
    "408": "The request body stalled for longer than serve.body_timeout",
    "413": "The body is larger than serve.max_request_bytes",
    "503": "At capacity (serve.max_waiting), or the engine has died; retry after `Retry-After` seconds",
}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}


@dataclass(frozen=True)
class RouteDoc:
    errors: tuple[str, ...] = ()
    ok: str = "json"
    """``json`` (as generated), ``json+sse`` (JSON, or events with stream=true), ``text`` or ``empty``."""
    ok_description: str | None = None


BODY_ERRORS = ("400", "408", "413")
ROUTES: dict[tuple[str, str], RouteDoc] = {
    ("/v1/completions", "post"): RouteDoc((*BODY_ERRORS, "404", "503"), "json+sse"),
    ("/v1/chat/completions", "post"): RouteDoc((*BODY_ERRORS, "404", "503"), "json+sse"),
    ("/v1/embeddings", "post"): RouteDoc((*BODY_ERRORS, "404", "503")),
    ("/tokenize", "post"): RouteDoc((*BODY_ERRORS, "404")),
    ("/detokenize", "post"): RouteDoc((*BODY_ERRORS, "404")),
    ("/v1/load_lora_adapter", "post"): RouteDoc(BODY_ERRORS, "text"),
    ("/v1/unload_lora_adapter", "post"): RouteDoc((*BODY_ERRORS, "404"), "text"),
    ("/v1/models/{model_id}", "get"): RouteDoc(("404",)),
    ("/sleep", "post"): RouteDoc(("400",), "empty", "The engine sleeps (no body)"),
    ("/wake_up", "post"): RouteDoc(("400",), "empty", "The engine is awake (no body)"),
    ("/health", "get"): RouteDoc(("503",), "empty", "The engine is running (no body)"),
    ("/ping", "get"): RouteDoc(("503",), "empty", "The engine is running (no body)"),
    ("/ping", "post"): RouteDoc(("503",), "empty", "The engine is running (no body)"),
    ("/metrics", "get"): RouteDoc((), "text", "Prometheus text exposition format"),
}


def install_openapi(app: FastAPI, api_key_set: bool) -> None:
    """Make ``app.openapi()`` (served at /openapi.json) the corrected schema, built once."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            with warnings.catch_warnings():  # one route, several methods: made unique in ``corrected``
                warnings.filterwarnings("ignore", message="Duplicate Operation ID")
                schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            app.openapi_schema = corrected(schema, api_key_set)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def corrected(schema: dict[str, Any], api_key_set: bool) -> dict[str, Any]:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    components["ErrorResponse"] = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, sub in components["ErrorResponse"].pop("$defs", {}).items():
        components.setdefault(name, sub)
    seen: set[str] = set()
    for path, methods in schema.get("paths", {}).items():
        for method, operation in methods.items():
            if operation.get("operationId") in seen:
                operation["operationId"] = f"{operation['operationId']}_{method}"
            seen.add(operation.get("operationId"))
            doc = ROUTES.get((path, method), RouteDoc())
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            _fix_ok(responses, doc)
            errors = doc.errors + (("401",) if api_key_set and path not in OPEN_PATHS else ())
            for code in errors:
                responses[code] = _error_response(code, path)
    return schema


def _fix_ok(responses: dict[str, Any], doc: RouteDoc) -> None:
    ok = responses.setdefault("200", {"description": "OK"})
    if doc.ok_description:
        ok["description"] = doc.ok_description
    if doc.ok == "empty":
        ok.pop("content", None)
    elif doc.ok == "text":
        ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
    elif doc.ok == "json+sse":
        ok.setdefault("content", {})["text/event-stream"] = EVENT_STREAM


def _error_response(code: str, path: str) -> dict[str, Any]:
    meaning = MEANING[code]
    if path == "/health" and code == "503":
        meaning = "The engine has died (the server is exiting); retry after `Retry-After` seconds"
    response: dict[str, Any] = {"description": meaning, "content": {"application/json": {"schema": ERROR_REF}}}
    if path == "/ping":
        response = {"description": "The engine has died (no body)"}
    if code == "503":
        response["headers"] = RETRY_AFTER
    return response
