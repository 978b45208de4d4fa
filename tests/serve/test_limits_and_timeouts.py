"""Abuse a server cannot be broken by: bodies over serve.max_request_bytes (413), prompts
too long to ever fit (400 before tokenizing, the server responsive meanwhile), stalled
headers and bodies (408 and closed), and shutdown cutting streams (an error event and
[DONE], no traceback)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest

from minivllm.serve import admission

BIG = 256 * 1024


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(max_request_bytes=BIG, header_timeout=0.5, body_timeout=0.5)


def test_a_body_over_max_request_bytes_is_a_413_with_the_openai_body(server):
    body = {"prompt": "x" * (BIG + 10), "max_tokens": 1}
    res = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30)
    assert res.status_code == 413, res.text
    error = res.json()["error"]
    assert error["code"] == 413 and error["param"] == "body" and "serve.max_request_bytes" in error["message"]

    def chunks():  # no Content-Length: counted as it arrives
        yield b'{"prompt": "'
        for _ in range(BIG // 4096 + 2):
            yield b"y" * 4096
        yield b'"}'

    res = httpx.post(
        f"{server.base_url}/v1/completions", content=chunks(), headers={"content-type": "application/json"}, timeout=30
    )
    assert res.status_code == 413 and res.json()["error"]["param"] == "body"
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


def test_a_huge_prompt_is_refused_before_tokenizing_and_health_stays_responsive(async_engine):
    handle = async_engine.start_server()  # the default body limit: a few MB pass it
    state = handle.app.state.server
    bound = async_engine.cfg.max_model_len * state.max_token_chars
    prompt = "hello world " * (3_000_000 // 12)  # 3 MB; tokenizing it on the loop took seconds
    assert len(prompt) > 100 * bound
    answer: dict = {}

    def big() -> None:
        t0 = time.perf_counter()
        answer["res"] = httpx.post(f"{handle.base_url}/v1/completions", json={"prompt": prompt}, timeout=60)
        answer["seconds"] = time.perf_counter() - t0

    try:
        with httpx.Client(base_url=handle.base_url, timeout=30) as http:
            http.get("/health")  # connected
            sender = threading.Thread(target=big)
            sender.start()
            latencies = []
            while sender.is_alive() or not latencies:
                t0 = time.perf_counter()
                assert http.get("/health").status_code == 200
                latencies.append(time.perf_counter() - t0)
            sender.join()
            chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": prompt}]})
            tok = http.post("/tokenize", json={"prompt": prompt})
    finally:
        handle.stop()
    res = answer["res"]
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert error["param"] == "prompt" and "characters" in error["message"] and "max_model_len" in error["message"]
    assert max(latencies) < 1.0, latencies
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
    assert tok.status_code == 400 and tok.json()["error"]["param"] == "prompt"


def test_tokenizing_runs_off_the_event_loop(server, monkeypatch):
    engine = server.harness.engine
    threads = []
    process = engine.process

    def recording(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return process(*args, **kwargs)

    monkeypatch.setattr(engine, "process", recording)
    res = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": ["a b", "c"], "max_tokens": 1}, timeout=30)
    assert res.status_code == 200, res.text
    assert len(threads) == 2 and all(name.startswith("minivllm-tokenize") for name in threads), threads
    assert admission._TOKENIZER_THREAD._max_workers == 1


def _read_until_closed(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    sock.settimeout(timeout)
    t0, data = time.monotonic(), b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - t0


def test_half_sent_headers_are_closed_after_header_timeout(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        data, waited = _read_until_closed(sock, timeout=10)
    assert data.startswith(b"HTTP/1.1 408") and b"serve.header_timeout" in data
    assert 0.4 < waited < 5


def test_a_stalled_body_is_a_408_and_closed_after_body_timeout(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        head = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        sock.sendall(head + b'{"prompt": "')  # 12 of 100 bytes
        data, waited = _read_until_closed(sock, timeout=10)
    status, _, rest = data.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 408"), data
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == 408 and "serve.body_timeout" in error["message"]
    assert waited < 5


def test_shutdown_timeout_ends_cut_streams_with_an_error_event_and_done(async_engine, caplog):
    handle = async_engine.start_server(shutdown_timeout=0.0)  # cut at once: the stream cannot finish first
    body = {"prompt": "a", "max_tokens": 250, "n": 8, "ignore_eos": True, "stream": True}
    caplog.set_level(logging.INFO)
    uvicorn_log = logging.getLogger("uvicorn.error")  # its errors (a cancelled task) do not reach the root logger
    uvicorn_log.addHandler(caplog.handler)
    try:
        with httpx.Client(base_url=handle.base_url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=body) as res:
                events = res.iter_lines()
                assert next(events).startswith("data: {")
                stopper = threading.Thread(target=handle.stop)  # as SIGTERM does: should_exit, then shutdown
                stopper.start()
                rest = [e for e in events if e]
        stopper.join(30)
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2][len("data: ") :])["error"]
    assert "serve.shutdown_timeout=0 s" in error["message"] and "\n" not in error["message"]
    text = caplog.text
    assert "Traceback" not in text and "CancelledError" not in text and "Cancel " not in text
    assert any("shutdown_timeout" in r.getMessage() for r in caplog.records)
