"""task=serve: ``python -m minivllm task=serve model=... serve.port=8000``.

Starts the engine process, then uvicorn on ``serve.host:serve.port`` (port 0
picks a free one; the bound address is printed and written to serve.json).
SIGTERM or Ctrl-C stops accepting connections, lets in-flight requests finish
for up to ``serve.shutdown_timeout`` seconds (then ends them with an error,
which aborts their engine requests), stops the engine and releases the port.
If the engine dies, the server shuts down the same way and the process exits
with status 1 (server.py).
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import time
from pathlib import Path
from typing import Any

from minivllm.config.task import metric_name
from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.async_llm import AsyncLLM
from minivllm.serve.app import build_app
from minivllm.serve.server import ApiServer
from minivllm.serve.server import make_server as server_for

logger = logging.getLogger(__name__)


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


def make_server(app: Any, cfg: VllmConfig, log_level: str = "info") -> ApiServer:
    """uvicorn over ``app`` (from ``build_app``), with the limits, timeouts and exit rules of server.py."""
    return server_for(app, cfg, app.state.server.engine, log_level)


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
