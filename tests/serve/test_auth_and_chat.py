"""A server with serve.api_key and serve.chat_template: 401 without the key, and chat
completions that equal a plain completion of the template's rendering."""

from __future__ import annotations

import httpx
import openai
import pytest

from minivllm.serve.state import load_chat_template

KEY = "sk-test-123"
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    path = tmp_path_factory.mktemp("template") / "chat.jinja"
    path.write_text(TEMPLATE)
    return start_server(api_key=KEY, chat_template=str(path))


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}])
def test_v1_routes_want_the_key(server, headers):
    with httpx.Client(base_url=server.base_url, timeout=30, headers=headers) as http:
        answers = [
            http.get("/v1/models"),
            http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}),
            http.post("/v1/chat/completions", json={"messages": MESSAGES}),
        ]
        for res in answers:
            assert res.status_code == 401
            assert res.json()["error"]["type"] == "authentication_error"
        assert http.get("/health").status_code == 200  # health and metrics stay open
        assert http.get("/metrics").status_code == 200


def test_the_key_opens_the_routes(client):
    assert len(client.models.list().data) == 1


def test_chat_equals_completion_of_the_rendered_template(server, client):
    tokenizer = server.harness.engine.tokenizer
    rendered = tokenizer.apply_chat_template(
        MESSAGES, chat_template=TEMPLATE, add_generation_prompt=True, tokenize=False
    )
    assert rendered.endswith("<|assistant|>\n")
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    plain = client.completions.create(model=server.model_name, prompt=ids, max_tokens=8, temperature=0)
    chat = client.chat.completions.create(model=server.model_name, messages=MESSAGES, max_tokens=8, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.usage.prompt_tokens == len(ids)
    assert chat.usage.completion_tokens == 8 and chat.choices[0].finish_reason == "length"


def test_a_chat_context_window_error_speaks_of_the_messages(server):
    """The completions route says "prompt" (tests/serve/test_bad_input.py); chat says "messages"."""
    max_len, tokenizer = server.harness.cfg.max_model_len, server.harness.engine.tokenizer
    long = [{"role": "user", "content": "hi " * max_len}]
    with httpx.Client(base_url=server.base_url, timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as http:
        for messages, max_tokens, param in [(long, 4, "messages"), (MESSAGES, 100_000, "max_tokens")]:
            res = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": max_tokens})
            assert res.status_code == 400 and res.json()["error"]["param"] == param, res.text
            rendered = tokenizer.apply_chat_template(
                messages, chat_template=TEMPLATE, add_generation_prompt=True, tokenize=False
            )
            n = len(tokenizer.encode(rendered, add_special_tokens=False))
            assert res.json()["error"]["message"] == (
                f"This model's maximum context length is {max_len} tokens. However, you requested "
                f"{n + max_tokens} tokens ({n} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion."
            )


def test_chat_stream_equals_chat(server, client):
    full = client.chat.completions.create(model=server.model_name, messages=MESSAGES, max_tokens=10, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=server.model_name,
            messages=MESSAGES,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == full.usage.model_dump()


def test_openai_fields_at_their_defaults_through_extra_body_change_nothing(server, client):
    """What SDKs and frameworks send with the value that asks for nothing (protocol.UNIMPLEMENTED_*)."""
    defaults = {
        "functions": None,
        "reasoning_effort": None,
        "metadata": None,
        "service_tier": None,
        "store": False,
        "parallel_tool_calls": True,
        "user": "someone",
        "logit_bias": None,
        "stream_options": None,
        "modalities": None,
        "audio": None,
        "prediction": None,
        "web_search_options": None,
    }
    ask = {"model": server.model_name, "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    plain = client.chat.completions.create(**ask)
    sent = client.chat.completions.create(**ask, extra_body=defaults)
    assert sent.choices[0].model_dump() == plain.choices[0].model_dump()
    assert sent.usage.model_dump() == plain.usage.model_dump()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**ask, extra_body={**defaults, "store": True})
    assert refused.value.body["param"] == "store" and "not implemented" in refused.value.body["message"]


def test_chat_logprobs(server, client):
    res = client.chat.completions.create(
        model=server.model_name, messages=MESSAGES, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    content = res.choices[0].logprobs.content
    assert len(content) == res.usage.completion_tokens == 5
    for entry in content:
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy: the most likely
        assert entry.top_logprobs[0].token == entry.token
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token


def test_a_missing_template_file_fails_at_start_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match="serve.chat_template"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    assert load_chat_template(TEMPLATE) == TEMPLATE


def test_a_stream_keeps_one_created_timestamp(server, client, monkeypatch):
    """Every chunk of a stream carries the stream's ``created``, as OpenAI's do, even when
    the clock moves between chunks (here it moves a second at each reading)."""
    import itertools
    import types

    from minivllm.serve import chat, completions, protocol

    clock = itertools.count(1_000_000)
    fake = types.SimpleNamespace(time=lambda: next(clock))
    for module in (chat, completions, protocol):
        monkeypatch.setattr(module, "time", fake)
    kwargs = dict(model=server.model_name, max_tokens=6, temperature=0, stream=True)
    chat_chunks = list(client.chat.completions.create(messages=MESSAGES, **kwargs))
    completion_chunks = list(client.completions.create(prompt="def add(a, b):", **kwargs))
    for chunks in (chat_chunks, completion_chunks):
        assert len(chunks) > 2 and len({c.created for c in chunks}) == 1, [c.created for c in chunks]
