"""Image URLs on a server of a model that takes images: loopback URLs refused by default and allowed only by name; nothing fetched for more images than the
limit; a slow media server delays neither a text request nor /health beyond nothing,
and its own request is a 400 naming the deadline; a 144-megapixel PNG is a 400 in under
a second."""

from __future__ import annotations

import base64
import concurrent.futures
import time

import httpx
import pytest

from tests.multimodal.llava_checkpoint import data_url, random_image
from tests.multimodal.media_server import MediaServer, bomb_png
from tests.serve.harness import EngineHarness, engine_config

pytestmark = pytest.mark.slow  # an engine process of its own

DEADLINE_S = 2.0


@pytest.fixture(scope="module")
def media():
    with MediaServer() as server:
        yield server


@pytest.fixture(scope="module")
def harness(llava_dir):
    harness = EngineHarness(engine_config(llava_dir))
    yield harness
    harness.close()


@pytest.fixture(scope="module")
def default_server(harness):
    handle = harness.start_server()
    yield handle
    handle.stop()


def _chat(url: str, images: int = 1) -> dict:
    parts = [{"type": "text", "text": "What is this?"}]
    parts += [{"type": "image_url", "image_url": {"url": url}}] * images
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": 2, "temperature": 0.0}


def _post(server, route: str, body: dict, timeout: float = 60) -> httpx.Response:
    if route == "/tokenize":
        body = {k: v for k, v in body.items() if k in ("messages", "prompt")}
    return httpx.post(f"{server.base_url}{route}", json=body, timeout=timeout)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/tokenize"])
def test_loopback_and_link_local_are_refused_by_default(default_server, media, route):
    before = media.hits
    # loopback only: private and link-local addresses are tried DNS-free in test_fetch.py
    for url in (f"{media.base}/pic.png", f"http://localhost:{media.port}/pic.png", f"http://[::1]:{media.port}/x"):
        res = _post(default_server, route, _chat(url))
        assert res.status_code == 400, res.text
        message = res.json()["error"]["message"]
        assert f"could not fetch {url}: its address is loopback, private" in message, message
    assert media.hits == before


def test_allowed_by_name_and_redirects_rechecked(harness, media):
    handle = harness.start_server(allowed_media_domains=["127.0.0.1"], media_fetch_timeout_s=DEADLINE_S)
    try:
        ok = _post(handle, "/v1/chat/completions", _chat(f"{media.base}/pic.png"))
        assert ok.status_code == 200, ok.text
        inward = f"{media.base}/redirect?to=http://localhost:{media.port}/pic.png"
        res = _post(handle, "/v1/chat/completions", _chat(inward))
        assert res.status_code == 400 and "not in serve.allowed_media_domains" in res.json()["error"]["message"]
        before = media.hits
        res = _post(handle, "/v1/chat/completions", _chat(f"{media.base}/pic.png", images=2))
        assert res.status_code == 400 and "limit_mm_per_prompt" in res.json()["error"]["message"], res.text
        assert media.hits == before  # more images than the limit: nothing fetched
    finally:
        handle.stop()


def test_fetching_turned_off(harness, media):
    handle = harness.start_server(allowed_media_domains=["127.0.0.1"], fetch_media_urls=False)
    try:
        res = _post(handle, "/v1/chat/completions", _chat(f"{media.base}/pic.png"))
        assert res.status_code == 400 and "serve.fetch_media_urls" in res.json()["error"]["message"]
        assert _post(handle, "/v1/chat/completions", _chat(data_url(random_image(3)))).status_code == 200
    finally:
        handle.stop()


def test_a_slow_media_server_delays_only_its_own_requests(harness, media):
    """Eight requests (chat and /tokenize) naming a URL that drips a byte every 0.2 s: each is
    a 400 naming the deadline after about the deadline; meanwhile text requests and /health
    answer at their usual speed."""
    handle = harness.start_server(allowed_media_domains=["127.0.0.1"], media_fetch_timeout_s=DEADLINE_S)
    slow = _chat(f"{media.base}/drip")
    try:
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            start = time.monotonic()
            held = [
                pool.submit(_post, handle, "/v1/chat/completions" if i % 2 else "/tokenize", slow) for i in range(8)
            ]
            time.sleep(0.3)
            text_start = time.monotonic()
            text = _post(handle, "/v1/completions", {"prompt": "hello", "max_tokens": 2})
            tokenized = _post(handle, "/tokenize", {"prompt": "hello"})
            health = httpx.get(f"{handle.base_url}/health", timeout=30)
            text_s = time.monotonic() - text_start
            answers = [f.result() for f in held]
            held_s = time.monotonic() - start
        assert text.status_code == 200 and tokenized.status_code == 200 and health.status_code == 200
        assert text_s < 1.0, text_s
        for res in answers:
            assert res.status_code == 400, res.text
            assert (
                f"within the {DEADLINE_S:g} s deadline (serve.media_fetch_timeout_s)" in res.json()["error"]["message"]
            )
        assert held_s < DEADLINE_S + 2.0, held_s
        print(f"text request {text_s:.3f} s while 8 fetches dripped; the 8 answered 400 after {held_s:.2f} s")
    finally:
        stop_start = time.monotonic()
        handle.stop()
        assert time.monotonic() - stop_start < 5.0


def test_a_decompression_bomb_is_a_400_in_under_a_second(default_server):
    url = "data:image/png;base64," + base64.b64encode(bomb_png(12000, 12000)).decode()
    start = time.monotonic()
    res = _post(default_server, "/v1/chat/completions", _chat(url))
    took = time.monotonic() - start
    assert res.status_code == 400, res.text
    assert (
        "12000x12000" in res.json()["error"]["message"] and "serve.max_image_pixels" in res.json()["error"]["message"]
    )
    assert took < 1.0, took
    print(f"144-megapixel PNG ({len(url)} bytes as a data URL): 400 in {took:.3f} s")


def test_shutdown_does_not_wait_on_fetches(harness, media):
    """A fetch dripping under a 30 s deadline is cut when shutdown begins: the server stops
    at once (not after serve.shutdown_timeout) and the request gets its answer."""
    handle = harness.start_server(allowed_media_domains=["127.0.0.1"], media_fetch_timeout_s=30.0)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = pool.submit(_post, handle, "/v1/chat/completions", _chat(f"{media.base}/drip"))
        time.sleep(1.0)
        start = time.monotonic()
        handle.stop()
        stop_s = time.monotonic() - start
        res = held.result(timeout=30)
    assert res.status_code == 400 and "the server is shutting down" in res.json()["error"]["message"], res.text
    assert stop_s < 2.0, stop_s
    print(f"shutdown with a fetch in flight: {stop_s:.2f} s")
