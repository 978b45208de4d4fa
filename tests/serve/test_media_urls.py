"""What a client may make the server fetch, on a text-only model with serve.api_key set:
nothing. An image URL (to a media server that would answer) is refused before any fetch:
without the key on every route that renders messages, /tokenize included, and with the
key because the model takes no images. /health, /ping, /version and /metrics stay open."""

from __future__ import annotations

import httpx
import pytest

from tests.multimodal.media_server import MediaServer

KEY = "sk-media"
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] if m['content'] is string else 'parts' }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="module")
def media():
    with MediaServer() as server:
        yield server


@pytest.fixture(scope="module")
def server(async_engine, tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "chat.jinja"
    path.write_text(TEMPLATE)
    handle = async_engine.start_server(api_key=KEY, chat_template=str(path), allowed_media_domains=["127.0.0.1"])
    yield handle
    handle.stop()


def _messages(url: str) -> list[dict]:
    parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]
    return [{"role": "user", "content": parts}]


def test_nothing_is_fetched_without_the_key(server, media):
    before = media.hits
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        body = {"messages": _messages(f"{media.base}/pic.png")}
        for route in ("/tokenize", "/v1/chat/completions"):
            res = http.post(route, json=body)
            assert res.status_code == 401, (route, res.text)
            assert res.json()["error"]["type"] == "authentication_error"
        assert http.post("/detokenize", json={"tokens": [1]}).status_code == 401
        for route in ("/health", "/ping", "/version", "/metrics"):
            assert http.get(route).status_code == 200, route
    assert media.hits == before


def test_nothing_is_fetched_for_a_text_only_model(server, media):
    before = media.hits
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server.base_url, timeout=30, headers=headers) as http:
        for route in ("/tokenize", "/v1/chat/completions"):
            res = http.post(route, json={"messages": _messages(f"{media.base}/pic.png")})
            assert res.status_code == 400, (route, res.text)
            assert "takes no images" in res.json()["error"]["message"]
        assert http.post("/tokenize", json={"prompt": "hello"}).status_code == 200
    assert media.hits == before
