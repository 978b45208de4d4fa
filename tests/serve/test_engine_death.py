"""When the engine dies, in-flight requests get an error first, the server exits
(status 1 from task=serve, so a supervisor restarts it), and every answer about the
death is one line with ``Retry-After``, never a traceback."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from minivllm.engine.request_stream import EngineDeadError, one_line
from tests.serve.test_cli import start_serve, wait_for_line

WORKER_TRACEBACK = (
    "engine failed: Traceback (most recent call last):\n"
    '  File "/opt/site-packages/minivllm/executor/multiproc.py", line 88, in collective_rpc\n'
    "    raise RuntimeError(msg)\n"
    "RuntimeError: worker 1 died (exit code -9)\n"
)


def test_a_failure_report_becomes_one_line():
    assert one_line(WORKER_TRACEBACK) == "engine failed: RuntimeError: worker 1 died (exit code -9)"
    err = EngineDeadError(WORKER_TRACEBACK)
    assert str(err) == one_line(WORKER_TRACEBACK) and err.detail == WORKER_TRACEBACK
    assert str(EngineDeadError("engine process exited with code -9")) == "engine process exited with code -9"


def _assert_one_line_503(res: httpx.Response) -> str:
    assert res.status_code == 503, res.text
    assert int(res.headers["retry-after"]) > 0
    message = res.json()["error"]["message"]
    assert "\n" not in message and "Traceback" not in message and ".py" not in message
    return message


class DeadEngine:
    """The shared test engine as a server sees it once its engine died with ``failure``."""

    def __init__(self, engine, failure: str) -> None:
        self._engine, self.errored = engine, failure

    is_running = False

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def add_processed(self, request):
        raise EngineDeadError(self.errored)


@pytest.mark.parametrize("failure", ["engine process exited with code -9", WORKER_TRACEBACK])
def test_every_answer_about_a_dead_engine_is_one_line_with_retry_after(async_engine, failure):
    from minivllm.serve.app import build_app

    async def ask() -> list[httpx.Response]:
        app = build_app(DeadEngine(async_engine.engine, failure), async_engine.cfg)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            answers = [
                await client.get("/health"),
                await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}),
                await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "stream": True}),
                await client.get("/ping"),
            ]
        async_engine.engine.stat_loggers.remove(app.state.server.metrics)
        return answers

    health, completion, stream, ping = async_engine.run(ask())
    assert _assert_one_line_503(health) == _assert_one_line_503(completion) == one_line(failure)
    assert _assert_one_line_503(stream) == one_line(failure)
    assert ping.status_code == 503 and int(ping.headers["retry-after"]) > 0


@pytest.mark.slow
def test_task_serve_exits_with_status_1_when_its_engine_dies(llama_dir, tmp_path):
    proc, lines = start_serve(llama_dir, tmp_path)
    seen: list[str] = []
    try:
        port = int(wait_for_line(lines, r"serving .* on http://127\.0\.0\.1:(\d+)/v1", 180, seen).group(1))
        engine_pid = json.loads((tmp_path / "serve.json").read_text())["engine_pids"][0]
        body = {"prompt": "def f(x):", "max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            with http.stream("POST", "/v1/completions", json=body) as res:
                events = res.iter_lines()
                assert next(events).startswith("data: {")
                os.kill(engine_pid, signal.SIGKILL)  # mid-stream
                t0 = time.monotonic()
                rest = [e for e in events if e]
        assert rest[-1] == "data: [DONE]"  # the in-flight request got an error first
        error = json.loads(rest[-2][len("data: ") :])["error"]
        assert error["type"] == "engine_error" and "\n" not in error["message"]
        assert proc.wait(timeout=30) == 1
        assert time.monotonic() - t0 < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    while not lines.empty():
        seen.append(lines.get())
    assert "Traceback" not in "".join(seen)
    assert json.loads((tmp_path / "serve.json").read_text())["exit_code"] == 1
