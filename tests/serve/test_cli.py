"""``python -m minivllm task=serve``: serves on the port it prints, and on SIGTERM lets
the in-flight stream finish, exits 0 and releases the port."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from minivllm.config.store import build_config

REPO = Path(__file__).resolve().parents[2]


def read_lines_into(proc: subprocess.Popen, lines: queue.Queue) -> None:
    for line in proc.stdout:
        lines.put(line)


def wait_for_line(lines: queue.Queue, pattern: str, timeout: float, seen: list[str]) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return m
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s; output:\n{''.join(seen)}")


def start_serve(llama_dir: Path, run_dir: Path, *overrides: str) -> tuple[subprocess.Popen, queue.Queue]:
    """``python -m minivllm task=serve`` on the tiny checkpoint (CPU, a free port), its
    output read line by line into the returned queue."""
    cmd = [
        sys.executable,
        "-m",
        "minivllm",
        "task=serve",
        f"model.path={llama_dir}",
        "model.dtype=float32",
        "cache.num_gpu_blocks_override=64",
        "device=cpu",
        "serve.port=0",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=read_lines_into, args=(proc, lines), daemon=True).start()
    return proc, lines


@pytest.mark.slow
def test_serve_task_streams_and_shuts_down_gracefully_on_sigterm(llama_dir, tmp_path):
    proc, lines = start_serve(
        llama_dir,
        tmp_path,
        "cache.block_size=8",
        "serve.host=127.0.0.1",
        "serve.served_model_name=tiny",
        "serve.shutdown_timeout=60",
    )
    seen: list[str] = []
    try:
        port = int(wait_for_line(lines, r"serving 'tiny' on http://127\.0\.0\.1:(\d+)/v1", 180, seen).group(1))
        body = {
            "model": "tiny",
            "prompt": "def f(x):",
            "max_tokens": 24,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=body) as res:
                events = res.iter_lines()
                assert next(events).startswith("data: {")
                proc.send_signal(signal.SIGTERM)  # mid-stream
                rest = [e for e in events if e]
        assert rest[-1] == "data: [DONE]"
        usage = json.loads(rest[-2][len("data: ") :])["usage"]
        assert usage["completion_tokens"] == 24  # the in-flight request finished
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    with socket.socket() as sock:  # released: a new server can listen there (TIME_WAIT allowed, as servers do)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
    summary = json.loads((tmp_path / "serve.json").read_text())
    assert summary["port"] == port and summary["generation_tokens"] == 24


@pytest.mark.parametrize(
    "override",
    [
        "serve.port=70000",
        "serve.port=-1",
        "serve.shutdown_timeout=-5",
        "serve.max_request_bytes=10",
        "serve.header_timeout=0",
        "serve.max_header_bytes=100",
    ],
)
def test_bad_serve_values_fail_when_the_config_is_built(llama_dir, override):
    key = override.split("=")[0]
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        build_config([f"model.path={llama_dir}", "task=serve", override])
