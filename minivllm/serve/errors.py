"""The errors a client can cause besides a 400 (``params.BadRequest``), each with
its OpenAI status code, and the client that went away.

    raise ModelNotFound("gpt-4", served="demo-llama")       # 404, type NotFoundError
    raise Overloaded("...", retry_after=1)                  # 503 with Retry-After
    raise ClientDisconnected()                              # no answer: the abort is done
    raise ShuttingDown(30.0)                                # serve.shutdown_timeout ran out (503)

Each is turned into a response by ``app.py``'s handlers; none is logged with a
traceback, since none is a server bug.
"""

from __future__ import annotations

from minivllm.engine.request_stream import EngineDeadError

DEAD_ENGINE_RETRY_AFTER_S = 10
"""``Retry-After`` on a 503 for a dead engine: the server exits, and a supervisor restarts it."""


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
