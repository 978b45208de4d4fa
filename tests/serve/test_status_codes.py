"""OpenAI's status codes and shapes, seen through the official ``openai`` client
(and httpx where the client hides the status or headers): 404 for an unknown
model, 400 for non-integer ``n`` and for messages without content, content-type
errors that say so, usage on every chunk with ``continuous_usage_stats``, and the
limits (``serve.max_n``: 400, ``serve.max_waiting``: 503 with Retry-After)."""

from __future__ import annotations

import contextlib
import time

import httpx
import openai
import pytest

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
MAX_WAITING = 4


@pytest.fixture(scope="module")
def server(start_server):
    limits = dict(max_n=8, max_seqs_per_request=17, max_waiting=MAX_WAITING)
    return start_server(chat_template=TEMPLATE, **limits)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


def test_unknown_model_is_a_404_not_found_error(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    error = info.value.body
    assert info.value.status_code == 404
    assert error["type"] == "NotFoundError" and error["param"] == "model" and "gpt-4" in error["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])


def test_n_must_be_an_integer(http):
    for n in (True, 1.0, "2"):
        res = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "n": n})
        assert res.status_code == 400, (n, res.text)
        assert res.json()["error"]["param"] == "n"


@pytest.mark.parametrize(
    "message,ok",
    [
        ({"role": "user"}, False),
        ({"role": "system", "content": None}, False),
        ({"role": "tool", "tool_call_id": "c1"}, False),
        ({"role": "assistant"}, False),
        ({"role": "wizard", "content": "hi"}, False),
        ({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}, True),
    ],
)
def test_chat_messages_are_checked_per_role(http, message, ok):
    """Only the role check is asserted for the accepted one (the engine may still refuse it later)."""
    res = http.post("/v1/chat/completions", json={"messages": [message], "max_tokens": 1})
    if ok:
        assert res.status_code == 200, res.text
        return
    assert res.status_code == 400, res.text
    error = res.json()["error"]
    assert error["param"] == "messages" and "messages[0]" in error["message"]


def test_a_body_that_is_not_json_says_so(http):
    for headers in ({"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"}, {}):
        res = http.post("/v1/completions", content=b'{"prompt": "x"}', headers=headers)
        assert res.status_code == 400, res.text
        assert "Content-Type must be application/json" in res.json()["error"]["message"]
    with_charset = {"content-type": "application/json; charset=utf-8"}
    res = http.post("/v1/completions", content=b'{"prompt": "x", "max_tokens": 1}', headers=with_charset)
    assert res.status_code == 200


def test_continuous_usage_is_on_every_chunk(server, client):
    stream = client.completions.create(
        model=server.model_name,
        prompt="def f(x):",
        max_tokens=5,
        temperature=0,
        n=2,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )
    chunks = list(stream)
    assert all(c.usage is not None for c in chunks)
    completion = [c.usage.completion_tokens for c in chunks]
    assert completion == sorted(completion) and completion[-1] == 10
    assert {c.usage.prompt_tokens for c in chunks} == {chunks[-1].usage.prompt_tokens}
    chat = list(
        client.chat.completions.create(
            model=server.model_name,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"continuous_usage_stats": True},
        )
    )
    assert all(c.usage is not None for c in chat)
    assert chat[0].usage.completion_tokens == 0 and chat[-1].usage.completion_tokens == 4


def test_n_above_max_n_and_too_many_sequences_are_400(client, server):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=server.model_name, prompt="x", max_tokens=1, n=9)
    assert info.value.body["param"] == "n" and "serve.max_n=8" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=server.model_name, prompt=["x", "y", "z"], max_tokens=1, n=8)
    assert "serve.max_seqs_per_request=17" in info.value.body["message"]


def test_a_full_waiting_queue_is_a_503_with_retry_after(server, http):
    """Streamed requests hold every seat plus the whole waiting allowance; the next one is refused
    before anything is queued, and accepted again once they are gone."""
    seats = server.harness.cfg.scheduler.max_num_seqs + MAX_WAITING
    assert seats == 4 * 17
    room = server.harness.cfg.max_model_len - 8  # 68 such sequences overflow the KV cache many times
    hold = {"prompt": [f"{i}" for i in range(17)], "max_tokens": room, "ignore_eos": True, "stream": True}
    # On a loaded machine the first stream's running sequences can finish while the last ones
    # are opened (they free seats and the probe is rightly admitted): a few tries, each from
    # an idle engine; one 503 proves the bound, and a server without it never gives one.
    for _ in range(3):
        with contextlib.ExitStack() as held:
            for _ in range(4):
                assert held.enter_context(http.stream("POST", "/v1/completions", json=hold)).status_code == 200
            refused = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        _wait_until_admitted(http)
        if refused.status_code != 200:
            break
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "ServiceUnavailableError"
    assert server.metric("vllm:http_requests_total", status="500") == 0


def _wait_until_admitted(http) -> None:
    deadline = time.monotonic() + 30  # the server notices the closed streams and aborts them
    while (res := http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})).status_code == 503:
        assert time.monotonic() < deadline, "the aborted streams never freed their places"
        time.sleep(0.05)
    assert res.status_code == 200
