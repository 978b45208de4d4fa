"""Constrained chat output (tool_choice required or named, response_format) cut short
by max_tokens, and combined with a reasoning parser, through the official openai
client and raw SSE."""

from __future__ import annotations

import json

import httpx
import pytest

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
CUT_SHORT = [
    {"tools": [WEATHER], "tool_choice": "required"},
    {"tools": [WEATHER], "tool_choice": NAMED},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}},
]


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(chat_template=TEMPLATE)


@pytest.fixture(scope="module")
def r1_server(start_server):
    """DeepSeek-R1's parser: output without ``</think>`` would all be reasoning."""
    return start_server(chat_template=TEMPLATE, reasoning_parser="deepseek_r1")


@pytest.fixture(scope="module")
def r1_client(r1_server, openai_client):
    return openai_client(r1_server)


@pytest.mark.parametrize("extra", CUT_SHORT, ids=["required", "named", "json_schema"])
def test_constrained_output_cut_short_is_length_with_its_text(server, client, extra):
    res = client.chat.completions.create(model=server.model_name, messages=MESSAGES, max_tokens=3, **extra)
    (choice,) = res.choices
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert choice.message.content and res.usage.completion_tokens == 3
    with pytest.raises(ValueError):
        json.loads(choice.message.content)


@pytest.mark.parametrize("extra", CUT_SHORT, ids=["required", "named", "json_schema"])
def test_constrained_stream_cut_short_ends_with_finish_reason_and_done(server, extra):
    body = {"model": server.model_name, "messages": MESSAGES, "max_tokens": 3, "stream": True, **extra}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=60) as res:
        assert res.status_code == 200
        lines = [line for line in res.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    assert all("error" not in e for e in events)
    reasons = [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]
    assert reasons == ["length"]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    calls = [t for e in events for c in e["choices"] for t in c["delta"].get("tool_calls") or []]
    assert text and not calls  # calls are held back until they parse; cut short, it is content


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("extra", CUT_SHORT, ids=["required", "named", "json_schema"])
def test_reasoning_parser_leaves_constrained_output_to_content_and_tool_calls(r1_server, r1_client, extra, stream):
    one_call = {"parallel_tool_calls": False} if "tools" in extra else {}
    res = r1_client.chat.completions.create(
        model=r1_server.model_name, messages=MESSAGES, max_tokens=100, stream=stream, **one_call, **extra
    )
    if stream:
        reasoning = content = arguments = ""
        for chunk in res:
            for c in chunk.choices:
                reasoning += getattr(c.delta, "reasoning_content", None) or ""
                content += c.delta.content or ""
                arguments += "".join(t.function.arguments or "" for t in c.delta.tool_calls or [])
        calls = [arguments] if arguments else []
    else:
        message = res.choices[0].message
        reasoning, content = message.reasoning_content or "", message.content or ""
        calls = [t.function.arguments for t in message.tool_calls or []]
    assert not reasoning
    if "tool_choice" in extra:
        assert calls and not content
        for arguments in calls:
            assert isinstance(json.loads(arguments), dict)
    else:
        assert json.loads(content)["city"] is not None and not calls
