"""Every error a client can see: the exceptions the routes raise, the OpenAI error body
(``{"error": {"message", "type", "param", "code"}}``) and the handlers that turn each
into its status.

    raise BadRequest("n", "n=0: must be in [1, 8]")         # 400, param names the field
    raise ModelNotFound("gpt-4", served="demo-llama")       # 404, type NotFoundError
    raise Overloaded("...", retry_after=1)                  # 503 with Retry-After
    raise ClientDisconnected()                              # no answer: the abort is done
    raise ShuttingDown(30.0)                                # serve.shutdown_timeout ran out (503)

Every bad request is a 400 naming the field; the engine never sees it. A body pydantic
refuses is worded here too (``describe_validation``): the field, its position, and for a
number out of range the engine's own words. A dead engine is a 503 with ``Retry-After``
(one line, never a traceback). None of these is logged with a traceback, since none is
a server bug; only a server bug is a 500.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from minivllm.engine.request_stream import EngineDeadError, one_line
from minivllm.serve.protocol import ErrorInfo, ErrorResponse, out_of_range

logger = logging.getLogger(__name__)

DEAD_ENGINE_RETRY_AFTER_S = 10
"""``Retry-After`` on a 503 for a dead engine: the server exits, and a supervisor restarts it."""


class BadRequest(ValueError):
    """A 400: ``param`` names the offending field."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFound(Exception):
    """A request named a model this server does not serve (404, as OpenAI and vLLM answer)."""

    def __init__(self, model: str, served: str) -> None:
        super().__init__(f"The model `{model}` does not exist; this server serves `{served}`")
        self.param = "model"


class Overloaded(Exception):
    """The server will not queue more work now (503 with ``Retry-After``)."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ClientDisconnected(Exception):
    """The client hung up before its answer was ready; its requests are aborted."""

    STATUS = 499
    """What the access log and /metrics record (nginx's "client closed request")."""


class ShuttingDown(EngineDeadError):
    """The server is shutting down and ``serve.shutdown_timeout`` ran out before the request
    finished; handled as a dead engine (a 503, or an error event then ``[DONE]``)."""

    def __init__(self, shutdown_timeout: float) -> None:
        super().__init__(
            f"the server is shutting down: serve.shutdown_timeout={shutdown_timeout:g} s ran out before this "
            "request finished"
        )


def param_of(message: str) -> str | None:
    """The field a ValueError names: messages here start with ``field=value:`` or ``field:``."""
    m = re.match(r"^([A-Za-z_][A-Za-z_0-9.\[\]]*)\s*[=:]", message)
    return m.group(1) if m else None


def bad_request(err: ValueError, rename: dict[str, str] | None = None) -> BadRequest:
    """Wrap an engine ValueError; ``rename`` maps engine names to request names (prompt -> messages)."""
    if isinstance(err, BadRequest):
        return err
    param = getattr(err, "param", None) or param_of(str(err))
    return BadRequest((rename or {}).get(param, param) if param else None, str(err))


def error_body(message: str, kind: str = "invalid_request_error", code: int = 400, param: Any = None) -> ErrorResponse:
    return ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=code))


def error_response(
    message: str, kind: str, code: int, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(message, kind, code, param).model_dump(), status_code=code, headers=headers)


def dead_engine_error(reason: str | None) -> JSONResponse:
    """The 503 for a dead engine: one line, never a traceback, and when to come back."""
    message = one_line(reason or "engine is not running")
    return error_response(message, "engine_error", 503, headers={"Retry-After": str(DEAD_ENGINE_RETRY_AFTER_S)})


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _wrong_content_type(request) or describe_validation(exc.errors())
        return error_response(message, "invalid_request_error", 400, param)

    @app.exception_handler(ModelNotFound)
    async def no_model(_: Request, exc: ModelNotFound) -> JSONResponse:
        return error_response(str(exc), "NotFoundError", 404, exc.param)

    @app.exception_handler(Overloaded)
    async def overloaded(_: Request, exc: Overloaded) -> JSONResponse:
        return error_response(str(exc), "ServiceUnavailableError", 503, headers={"Retry-After": str(exc.retry_after)})

    @app.exception_handler(ClientDisconnected)
    async def gone(request: Request, _: ClientDisconnected) -> Response:
        logger.info("%s: the client disconnected before the answer; its requests were aborted", request.url.path)
        return Response(status_code=ClientDisconnected.STATUS)

    @app.exception_handler(BadRequest)
    async def bad(_: Request, exc: BadRequest) -> JSONResponse:
        return error_response(str(exc), "invalid_request_error", 400, exc.param)

    @app.exception_handler(ValueError)
    async def value_error(_: Request, exc: ValueError) -> JSONResponse:
        return error_response(str(exc), "invalid_request_error", 400, param_of(str(exc)))

    @app.exception_handler(EngineDeadError)
    async def dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return dead_engine_error(str(exc))

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error")
        return error_response(f"internal error: {type(exc).__name__}: {exc}", "internal_error", 500)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        param = "body" if exc.status_code in (408, 413) else None
        return error_response(str(exc.detail), kind, exc.status_code, param, headers=exc.headers)  # keeps a 405's Allow


def _wrong_content_type(request: Request) -> tuple[str, None] | None:
    """The complaint for a body FastAPI did not parse as JSON because of its Content-Type."""
    given = request.headers.get("content-type")
    media = (given or "").split(";")[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return None
    sent = f"got {given!r}" if given else "none was sent"
    return f"body: Content-Type must be application/json ({sent})", None


def describe_validation(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
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
    message = out_of_range(err, param, where)
    if message is not None:
        return message, param
    detail = f" (at {param}{where})" if where else ""
    return f"{param}: {_own_words(err)}{detail}", param


def _own_words(err: dict[str, Any]) -> str:
    """A validator's own message, without the "Value error, " pydantic puts before it."""
    raised = err.get("ctx", {}).get("error") if err.get("type") == "value_error" else None
    return str(raised) if raised is not None else err["msg"]
