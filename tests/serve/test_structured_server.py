"""Structured outputs, tool calling and reasoning through the server, with the
official openai client, on the demo model (its free text is never valid JSON)."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest

from minivllm.tokenizer import DEMO_TOKENIZER

TEMPLATE = (
    "{% if tools %}<|tools|>{% for t in tools %}{{ t['function']['name'] }};{% endfor %}\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
    },
    "required": ["name", "age", "role", "tags"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
COMPACT = {"disable_any_whitespace": True}


@pytest.fixture(scope="module")
def server(make_engine):
    harness = make_engine(DEMO_TOKENIZER)
    return harness.start_server(chat_template=TEMPLATE, tool_call_parser="hermes", reasoning_parser="qwen3")


def _streamed_texts(stream) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in stream:
        for choice in chunk.choices:
            piece = choice.text if hasattr(choice, "text") else (choice.delta.content or "")
            texts[choice.index] = texts.get(choice.index, "") + piece
    return texts


@pytest.mark.parametrize("stream", [False, True])
def test_completions_guided_json_n2(client, server, stream):
    extra = {"structured_outputs": {"json": SCHEMA, **COMPACT}}
    res = client.completions.create(
        model=server.model_name,
        prompt="Once upon a time",
        n=2,
        max_tokens=80,
        temperature=1.0,
        seed=1,
        stream=stream,
        extra_body=extra,
    )
    texts = _streamed_texts(res) if stream else {c.index: c.text for c in res.choices}
    assert sorted(texts) == [0, 1]
    for text in texts.values():
        jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_response_format_json_schema_n2(client, server, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
    res = client.chat.completions.create(
        model=server.model_name,
        messages=MESSAGES,
        n=2,
        max_tokens=150,
        temperature=1.0,
        seed=2,
        stream=stream,
        response_format=fmt,
    )
    texts = _streamed_texts(res) if stream else {c.index: c.message.content for c in res.choices}
    assert sorted(texts) == [0, 1]
    for text in texts.values():
        jsonschema.validate(json.loads(text), SCHEMA)


def test_guided_regex_choice_and_json_object(client, server):
    date = r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"
    res = client.completions.create(
        model=server.model_name,
        prompt="Today is",
        max_tokens=20,
        temperature=1.0,
        seed=3,
        n=2,
        extra_body={"guided_regex": date},
    )
    assert all(re.fullmatch(date, c.text) for c in res.choices)
    for stream in (False, True):
        res = client.chat.completions.create(
            model=server.model_name,
            messages=MESSAGES,
            max_tokens=10,
            stream=stream,
            extra_body={"guided_choice": ["sunny", "rainy"]},
        )
        texts = _streamed_texts(res) if stream else {0: res.choices[0].message.content}
        assert texts[0] in ("sunny", "rainy")
    res = client.chat.completions.create(
        model=server.model_name,
        messages=MESSAGES,
        max_tokens=120,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(res.choices[0].message.content), dict)


def _check_weather_call(call) -> None:
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_tool_choice_named_and_required(client, server):
    res = client.chat.completions.create(
        model=server.model_name,
        messages=MESSAGES,
        tools=[WEATHER, TIME],
        tool_choice=NAMED,
        max_tokens=60,
        temperature=1.0,
        seed=4,
    )
    (call,) = res.choices[0].message.tool_calls
    _check_weather_call(call)
    res = client.chat.completions.create(
        model=server.model_name,
        messages=MESSAGES,
        tools=[WEATHER],
        n=2,
        tool_choice="required",
        max_tokens=120,
        temperature=1.0,
        seed=5,
    )
    for choice in res.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        for call in choice.message.tool_calls:
            _check_weather_call(call)


def _no_empty_deltas(stream):
    """The chunks of a chat stream, checked: after the first (the role), each says something
    (text held back while a tool call is parsed sends nothing, as in vLLM)."""
    for i, chunk in enumerate(stream):
        for choice in chunk.choices:
            d = choice.delta
            said = d.role or d.content or d.tool_calls or getattr(d, "reasoning_content", None)
            assert said or choice.finish_reason is not None or i == 0, chunk
        yield chunk


@pytest.mark.parametrize("tool_choice", ["required", NAMED])
def test_tool_choice_streamed(client, server, tool_choice):
    stream = client.chat.completions.create(
        model=server.model_name,
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice=tool_choice,
        max_tokens=120,
        temperature=1.0,
        seed=6,
        stream=True,
        parallel_tool_calls=False,
    )
    calls, reasons, ids = {}, [], set()
    for chunk in _no_empty_deltas(stream):
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                if d.id:
                    ids.add(d.id)
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
            reasons.append(choice.finish_reason)
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and len(ids) == 1
    assert reasons[-1] == ("tool_calls" if tool_choice == "required" else "stop")
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER["function"]["parameters"])


BLOCK = 'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}</tool_call>'


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_auto_parses_a_tool_call_block(client, server, stream):
    # The demo model never writes a tool call by itself: a choice makes it write one.
    res = client.chat.completions.create(
        model=server.model_name,
        messages=MESSAGES,
        tools=[WEATHER],
        max_tokens=150,
        stream=stream,
        extra_body={"guided_choice": [BLOCK]},
    )
    if not stream:
        message = res.choices[0].message
        assert message.content == "Checking." and res.choices[0].finish_reason == "tool_calls"
        (call,) = message.tool_calls
    else:
        content, deltas = "", []
        for chunk in _no_empty_deltas(res):
            for choice in chunk.choices:
                content += choice.delta.content or ""
                deltas += choice.delta.tool_calls or []
        assert content == "Checking." and len(deltas) == 1
        call = deltas[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris", "unit": "C"}


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_content_is_split(client, server, stream):
    forced = "<think>\nParis is in France.\n</think>\n\nIt is sunny."
    res = client.chat.completions.create(
        model=server.model_name,
        messages=MESSAGES,
        max_tokens=150,
        stream=stream,
        extra_body={"guided_choice": [forced]},
    )
    if stream:
        reasoning = content = ""
        for chunk in res:
            for choice in chunk.choices:
                reasoning += getattr(choice.delta, "reasoning_content", None) or ""
                content += choice.delta.content or ""
    else:
        message = res.choices[0].message
        reasoning, content = message.reasoning_content, message.content
    assert (reasoning, content) == ("Paris is in France.", "It is sunny.")


def test_chat_template_receives_tools(client, server):
    plain = client.chat.completions.create(
        model=server.model_name, messages=MESSAGES, max_tokens=1, tool_choice="none", tools=[WEATHER]
    )
    bare = client.chat.completions.create(model=server.model_name, messages=MESSAGES, max_tokens=1)
    tokenizer = server.harness.engine.tokenizer
    rendered = tokenizer.apply_chat_template(
        MESSAGES, tools=[WEATHER], chat_template=TEMPLATE, add_generation_prompt=True, tokenize=False
    )
    assert rendered.startswith("<|tools|>get_weather;")
    assert plain.usage.prompt_tokens == len(tokenizer.encode(rendered, add_special_tokens=False))
    assert plain.usage.prompt_tokens > bare.usage.prompt_tokens


@pytest.mark.parametrize(
    "route, body, param",
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": 2, "frobnicate": 1}, "frobnicate"),
        (
            "/v1/completions",
            {"prompt": "x", "max_tokens": 2, "guided_decoding_backend": "outlines"},
            "guided_decoding_backend",
        ),
        ("/v1/chat/completions", {"messages": MESSAGES, "functions": [WEATHER["function"]]}, "functions"),
        ("/v1/chat/completions", {"messages": MESSAGES, "audio": {"voice": "alloy"}}, "audio"),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "stream": True, "stream_options": {"include_obfuscation": True}},
            "stream_options",
        ),
        ("/v1/chat/completions", {"messages": MESSAGES, "guided_regex": "a", "guided_choice": ["a"]}, "guided_regex"),
        ("/v1/chat/completions", {"messages": MESSAGES, "guided_regex": "(unclosed"}, "guided_regex"),
        ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {"type": "yaml"}}, "response_format"),
        ("/v1/chat/completions", {"messages": MESSAGES, "tool_choice": "required"}, "tool_choice"),
        (
            "/v1/chat/completions",
            {
                "messages": MESSAGES,
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "structured_outputs": {"json": SCHEMA, "backend": "x"}},
            "structured_outputs",
        ),
    ],
)
def test_unimplemented_or_bad_fields_are_a_400_naming_them(server, route, body, param):
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        res = http.post(route, json=body)
        assert res.status_code == 400, res.text
        error = res.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error" and error["code"] == 400
        assert param in error["message"]
        ok = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "user": "someone"})
        assert ok.status_code == 200  # still serving; `user` is an accepted no-op
