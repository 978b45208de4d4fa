"""When the engine process dies, the server says so (503s, /health) instead of hanging."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from minivllm.engine.request_stream import EngineDeadError
from tests.serve.harness import EngineHarness, engine_config


@pytest.mark.slow
def test_killed_engine_fails_requests_and_health(llama_dir):
    harness = EngineHarness(engine_config(llama_dir))
    server = harness.start_server()
    try:
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            body = {"prompt": "def f(x):", "max_tokens": 4, "temperature": 0}
            assert http.post("/v1/completions", json=body).status_code == 200
            os.kill(harness.engine.engine_pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while harness.engine.is_running and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not harness.engine.is_running
            health = http.get("/health")
            assert health.status_code == 503 and "engine" in health.json()["error"]["message"]
            res = http.post("/v1/completions", json=body)
            assert res.status_code == 503 and res.json()["error"]["type"] == "engine_error"

        async def add():
            return await harness.engine.add_request("late", "x")

        with pytest.raises(EngineDeadError):
            harness.run(add())
    finally:
        server.stop()
        harness.close()
