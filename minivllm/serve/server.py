"""task=serve: ``python -m minivllm task=serve model=... serve.port=8000``, and uvicorn
made to fail safe.

    run_serve(cfg, out_dir)               # the engine process, then uvicorn, until a signal
    server = make_server(app, cfg)        # an ApiServer; server.run(sockets=[bind_socket(host, port)])
    sys.exit(server.exit_code)            # 1 once the engine died

``run_serve`` starts the engine process, then uvicorn on ``serve.host:serve.port``
(port 0 picks a free one; the bound address is printed and written to serve.json).

- **Engine death.** Every tick (0.1 s) the server checks the engine; once it is
  dead (the engine process exited, or reported a failure such as a dead worker)
  it logs one line and shuts down with ``exit_code = 1``. In-flight requests have
  already failed with ``EngineDeadError`` (a 503, or an error event and
  ``[DONE]``), so the graceful shutdown is quick, and a supervisor that restarts
  on exit brings the service back; the process exits with status 1.
- **Shutdown.** SIGTERM or Ctrl-C stops accepting connections and lets in-flight
  requests run for ``serve.shutdown_timeout`` seconds; then every unfinished request
  is ended with ``ShuttingDown`` (streams get an error event and ``[DONE]``, the
  others a 503), which aborts their engine requests, so no task is cancelled
  mid-write. uvicorn's own cancellation stays as a backstop ``CUT_GRACE_S`` later.
  Image fetches in flight are cut at once (their requests get a 400): shutdown never
  waits on a media server.
  Then the engine stops and the port is released.
- **Stalled connections.** ``serve.header_timeout`` bounds how long a connection
  may take to send a request's headers (``HeaderTimeoutH11``); the body's pieces
  are timed by ``app.BodyLimits``; idle keep-alive connections close after
  ``serve.keep_alive_timeout``; headers beyond ``serve.max_header_bytes`` are a 400.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import time
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from minivllm.config.task import metric_name
from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.async_llm import AsyncLLM
from minivllm.multimodal.fetch import MediaFetcher
from minivllm.serve.app import build_app
from minivllm.serve.errors import ShuttingDown

logger = logging.getLogger(__name__)

CUT_GRACE_S = 5.0
"""Seconds after the cut at ``serve.shutdown_timeout`` before uvicorn cancels what still runs."""


class ApiServer(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, engine: AsyncLLM, shutdown_timeout: float, fetcher: MediaFetcher | None = None
    ) -> None:
        super().__init__(config)
        self.engine = engine
        self.fetcher = fetcher
        """The server's media fetcher: its fetches in flight are cut when shutdown begins."""
        self.shutdown_timeout = shutdown_timeout
        self.exit_code = 0
        """1 once the server stopped because its engine died."""

    async def on_tick(self, counter: int) -> bool:
        if self.exit_code == 0 and not self.engine.is_running:
            reason = self.engine.errored or "engine is not running"
            logger.error("the engine is gone (%s); the server exits", reason.strip().splitlines()[-1])
            self.exit_code = 1
            return True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.fetcher is not None:
            self.fetcher.close()
        cut = asyncio.get_running_loop().call_later(self.shutdown_timeout, self._cut_requests)
        try:
            await super().shutdown(sockets)
        finally:
            cut.cancel()

    def _cut_requests(self) -> None:
        err = ShuttingDown(self.shutdown_timeout)
        if self.engine.is_running and (n := self.engine.fail_requests(err)):
            logger.warning(
                "serve.shutdown_timeout=%g s ran out: %d unfinished request(s) ended", self.shutdown_timeout, n
            )


class HeaderTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol, closing a connection (408) that has not sent a request's
    headers within ``header_timeout`` seconds of its start or of the previous answer
    (uvicorn times only idle keep-alive connections, not one that sent a few bytes)."""

    header_timeout = 30.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        if not self.transport.is_closing():
            self.loop.call_later(self.header_timeout, self._header_timeout, self.cycle)

    def _header_timeout(self, cycle_then: Any) -> None:
        if self.transport.is_closing() or self.cycle is not cycle_then:
            return  # closed, or a new request's headers arrived meanwhile
        message = f"request headers not received within serve.header_timeout={self.header_timeout:g} s".encode()
        head = f"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\ncontent-length: {len(message)}\r\n\r\n"
        self.transport.write(head.encode() + message)
        self.transport.close()


def make_server(app: Any, cfg: VllmConfig, log_level: str = "info") -> ApiServer:
    """uvicorn over ``app`` (from ``build_app``), with the limits, timeouts and exit rules above."""
    serve = cfg.serve
    protocol = type("ServeH11", (HeaderTimeoutH11,), {"header_timeout": serve.header_timeout})
    config = uvicorn.Config(
        app,
        log_level=log_level,
        http=protocol,
        timeout_keep_alive=serve.keep_alive_timeout,
        h11_max_incomplete_event_size=serve.max_header_bytes,
        timeout_graceful_shutdown=int(serve.shutdown_timeout + CUT_GRACE_S + 0.999),
        lifespan="off",
    )
    state = app.state.server
    return ApiServer(config, state.engine, serve.shutdown_timeout, state.media.fetcher)


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ValueError(f"serve.port={port}: cannot bind {host}:{port} ({err.strerror})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run_serve(cfg: VllmConfig, out_dir: Path) -> dict[str, Any]:
    server: ApiServer | None = None

    def on_signal(signum: int, _frame: Any) -> None:
        # Before uvicorn runs, stop at once; after it ran (it re-raises the signal
        # once its graceful shutdown is done), carry on to the clean exit below.
        if server is None or not server.started:
            raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = time.time()
    engine = AsyncLLM(cfg)
    for sig in previous:  # again: starting Ray (parallel.dp_backend=ray) replaces the SIGTERM handler
        signal.signal(sig, on_signal)
    try:
        app = build_app(engine, cfg)
        sock = bind_socket(cfg.serve.host, cfg.serve.port)
        host, port = sock.getsockname()[:2]
        server = make_server(app, cfg)
        (out_dir / "serve.json").write_text(json.dumps({"host": host, "port": port, "engine_pids": engine.engine_pids}))
        print(f"minivllm: serving {app.state.server.model_name!r} on http://{host}:{port}/v1", flush=True)
        server.run(sockets=[sock])
    finally:
        engine.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = {"host": host, "port": port, "seconds": time.time() - started, **_totals(app)}
    summary["exit_code"] = server.exit_code
    (out_dir / "serve.json").write_text(json.dumps(summary, indent=2))
    if server.exit_code:
        print(f"minivllm: the engine died; server stopped after {summary['seconds']:.1f} s", flush=True)
        raise SystemExit(server.exit_code)
    print(f"minivllm: server stopped after {summary['seconds']:.1f} s", flush=True)
    return summary


def _totals(app: Any) -> dict[str, float]:
    state = app.state.server
    labels = {"model_name": state.model_name}
    prefix = state.cfg.serve.metrics_prefix
    sample = state.metrics.registry.get_sample_value
    return {
        "prompt_tokens": sample(metric_name(prefix, "prompt_tokens_total"), labels) or 0.0,
        "generation_tokens": sample(metric_name(prefix, "generation_tokens_total"), labels) or 0.0,
    }
