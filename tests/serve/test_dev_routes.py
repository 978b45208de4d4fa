"""serve.dev_mode: /sleep, /wake_up and /is_sleeping (sleep mode over HTTP, on the shared engine,
which is built with enable_sleep_mode), absent without it; a completion after waking equals the
one before sleeping. (Sleep with sleep mode off is refused: tests/worker/test_sleep.py.)"""

from __future__ import annotations

import httpx
import pytest

BODY = {"prompt": "def f(x):", "max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def dev_server(async_engine, start_server):
    yield start_server(dev_mode=True)
    async_engine.run(async_engine.engine.wake_up())  # the other tests' engine is awake, whatever happened here


def _post(server, path: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", timeout=30, **kwargs)


def _sleeping(server) -> bool:
    return httpx.get(f"{server.base_url}/is_sleeping", timeout=30).json()["is_sleeping"]


def test_routes_need_dev_mode(start_server):
    server = start_server()
    assert _post(server, "/sleep").status_code == 404
    assert _post(server, "/wake_up").status_code == 404
    assert httpx.get(f"{server.base_url}/is_sleeping", timeout=30).status_code == 404


def test_sleep_and_wake_over_http(dev_server):
    before = _post(dev_server, "/v1/completions", json=BODY).json()["choices"][0]["text"]
    assert _post(dev_server, "/sleep", params={"level": 1}).status_code == 200
    assert _sleeping(dev_server) is True
    refused = _post(dev_server, "/v1/completions", json=BODY)
    assert refused.status_code == 400 and "the engine is sleeping" in refused.json()["error"]["message"]
    assert _post(dev_server, "/wake_up", params={"tags": "kv_cache"}).status_code == 200
    assert _sleeping(dev_server) is True  # the weights are still away
    assert _post(dev_server, "/wake_up", params={"tags": ["weights"]}).status_code == 200
    assert _sleeping(dev_server) is False
    assert _post(dev_server, "/v1/completions", json=BODY).json()["choices"][0]["text"] == before


def test_bad_dev_requests_are_400s(dev_server):
    bad_level = _post(dev_server, "/sleep", params={"level": 3})
    assert bad_level.status_code == 400 and bad_level.json()["error"]["param"] == "level"
    bad_tag = _post(dev_server, "/wake_up", params={"tags": "weight"})
    assert bad_tag.status_code == 400 and "allowed: weights, kv_cache" in bad_tag.json()["error"]["message"]
    assert _post(dev_server, "/sleep", params={"level": "deep"}).status_code == 400
    assert _sleeping(dev_server) is False
