"""One AsyncLLM on a background event loop, and servers over it on free loopback ports.

Starting an engine process costs seconds, so the serving tests share one
engine (session fixture ``async_engine``) and each test module starts its own
server on it (fixture ``start_server``); a test that needs another engine gets one
from ``make_engine``, and an openai client from ``openai_client`` or ``client``
(all in tests/conftest.py). Everything waits with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Iterator, TypeVar

from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.task import ServeConfig
from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.async_llm import AsyncLLM

T = TypeVar("T")
ENGINE_KWARGS = dict(
    dtype="float32", block_size=8, num_gpu_blocks_override=256, device="cpu", max_num_seqs=64, enable_sleep_mode=True
)
"""256 blocks of 8 tokens: 64 concurrent short requests fit without preemption. Sleep mode is allowed
(it costs nothing until used) for test_dev_routes.py, which wakes the engine before it returns."""


def engine_config(model: str | Path, **kwargs: Any) -> VllmConfig:
    """The config of an engine over ``model`` with ``config_from_kwargs``' keywords (``ENGINE_KWARGS``
    when none are given)."""
    return VllmConfig.from_dictconfig(config_from_kwargs(str(model), **(kwargs or ENGINE_KWARGS)))


@contextlib.contextmanager
def one_intra_op_thread() -> Iterator[None]:
    """Engine processes started inside run torch with one thread: the tiny test model
    gains nothing from more, and on a shared CPU spinning OpenMP threads make each
    step many times slower. (The child reads the variable when it imports torch.)"""
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = before


class EngineHarness:
    """An ``AsyncLLM`` and the event loop it runs on, in a thread of its own."""

    def __init__(self, cfg: VllmConfig) -> None:
        self.cfg = cfg
        with one_intra_op_thread():
            self.engine = AsyncLLM(cfg)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="serve-test-loop", daemon=True)
        self._thread.start()
        self._servers: list[ServerHandle] = []
        self._closed = False

    def run(self, work: Awaitable[T], timeout: float = 60) -> T:
        """Run a coroutine on the engine's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

    def start_server(self, **serve: Any) -> "ServerHandle":
        cfg = copy.copy(self.cfg)
        cfg.serve = ServeConfig(**{"shutdown_timeout": 5.0, **serve})
        self._servers.append(ServerHandle(self, cfg))
        return self._servers[-1]

    def __enter__(self) -> "EngineHarness":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop its servers, shut the engine down and end the loop; once, however often called."""
        if self._closed:
            return
        self._closed = True
        for server in reversed(self._servers):
            server.stop()
        self.engine.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


class ServerHandle:
    """uvicorn serving ``build_app(engine, cfg)`` on 127.0.0.1 with a port the OS picked."""

    def __init__(self, harness: EngineHarness, cfg: VllmConfig) -> None:
        from minivllm.serve.app import build_app
        from minivllm.serve.server import bind_socket, make_server

        async def build() -> Any:  # on the loop: the app's metrics hook into the engine there
            return build_app(harness.engine, cfg)

        self.harness = harness
        self.api_key = cfg.serve.api_key
        self.app = harness.run(build())
        self.model_name = self.app.state.server.model_name
        sock = bind_socket("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(self.app, cfg, log_level="warning")
        self._done = asyncio.run_coroutine_threadsafe(self.server.serve(sockets=[sock]), harness.loop)
        self._stopped = False
        deadline = time.monotonic() + 30
        while not self.server.started:
            if self._done.done():
                self._done.result()  # raises the start-up error
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start within 30 s")
            time.sleep(0.02)

    def stop(self) -> None:
        """Shut the server down and unhook its metrics from the engine; once, however often called."""
        if self._stopped:
            return
        self._stopped = True
        self.server.should_exit = True
        self._done.result(timeout=30)
        metrics = self.app.state.server.metrics

        async def unhook() -> None:
            self.harness.engine.stat_loggers.remove(metrics)

        self.harness.run(unhook())

    def metrics(self) -> dict[tuple[str, frozenset], float]:
        """GET /metrics parsed: {(sample name, labels): value}."""
        import httpx
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.base_url}/metrics", timeout=30).text
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def metric(self, name: str, **labels: str) -> float:
        """One sample (labels given must match; model_name is implied); 0 when absent."""
        want = set(labels.items())
        values = [v for (n, ls), v in self.metrics().items() if n == name and want <= ls]
        return sum(values)
