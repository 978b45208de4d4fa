"""Tool-call and reasoning parsers on fixed text, whole and streamed."""

from __future__ import annotations

import json

import pytest

from minivllm.config.task import ServeConfig
from minivllm.serve.reasoning import REASONING_PARSERS
from minivllm.serve.tools import TOOL_PARSERS


def test_hermes_parses_blocks_and_keeps_the_content():
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    content, calls = TOOL_PARSERS["hermes"]().parse(text)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert len({c.id for c in calls}) == 2


def test_hermes_leaves_plain_or_malformed_text_alone():
    parser = TOOL_PARSERS["hermes"]()
    assert parser.parse("no calls here") == ("no calls here", [])
    assert parser.parse("<tool_call>{not json</tool_call>") == ("<tool_call>{not json</tool_call>", [])
    assert parser.safe_prefix("hello <tool") == len("hello ")
    assert parser.safe_prefix("hello <tool_call>{") == len("hello ")
    assert parser.safe_prefix("hello") == 5


def test_llama3_json_parses_one_or_more_calls():
    parser = TOOL_PARSERS["llama3_json"]()
    content, calls = parser.parse(
        '<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}'
    )
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"x": 1}), ("g", {})]
    assert parser.parse("Paris is sunny.") == ("Paris is sunny.", [])
    assert parser.parse('{"no_name": 1}') == ('{"no_name": 1}', [])
    assert parser.safe_prefix(' {"na') == 0 and parser.safe_prefix("Paris") == 5


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("qwen3", "<think>\nfirst, 2+2</think>\n\nIt is 4.", ("first, 2+2", "It is 4.")),
        ("qwen3", "It is 4.", (None, "It is 4.")),
        ("qwen3", "<think>\nstep 1\n\nstep 2\n</think>\n\nIt is 4.", ("step 1\n\nstep 2", "It is 4.")),
        ("qwen3", "<think>still thinking", ("still thinking", None)),
        ("deepseek_r1", "first, 2+2</think>It is 4.", ("first, 2+2", "It is 4.")),
        ("deepseek_r1", "<think>a</think>b", ("a", "b")),
        ("deepseek_r1", "no end tag yet", ("no end tag yet", None)),
    ],
)
def test_think_parser_whole_and_streamed(name, text, expected):
    parser = REASONING_PARSERS[name]
    assert parser.split(text) == expected
    for size in (1, 3, 7):
        stream = parser.stream()
        reasoning = content = ""
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        for i, piece in enumerate(pieces):
            r, c = stream.feed(piece, final=i == len(pieces) - 1)
            assert "<think" not in r + c and "</think" not in r + c
            reasoning, content = reasoning + r, content + c
        assert (reasoning or None, content or None) == expected, size


@pytest.mark.parametrize("key", ["tool_call_parser", "reasoning_parser"])
def test_unknown_parser_names_are_refused_when_the_config_is_built(key):
    with pytest.raises(ValueError, match=f"serve.{key}='nope': must be one of"):
        ServeConfig(**{key: "nope"})
