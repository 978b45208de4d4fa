"""Tool calling in chat completions: checking ``tools`` and ``tool_choice``, the
constraint that enforces ``required`` and a named function, and turning the
output into OpenAI ``tool_calls``.

- ``none``: no calls are parsed; the text is the content.
- ``auto`` (the default when tools are given): the model decides; its output is
  read by the tool-call parser ``serve.tool_call_parser`` names (``TOOL_PARSERS``,
  vLLM's names: ``hermes``, ``llama3_json``).
- ``required``: the output is constrained to a JSON array of
  ``{"name": <a tool>, "parameters": <its arguments>}`` (at least one).
- a named function: the output is constrained to that tool's parameters schema;
  it is the call's arguments.

Constrained output that finished parses; output cut short (``finish_reason``
"length") does not, and is returned as content with no calls. A parser also says
how much of a streamed output is surely content (``safe_prefix``); the rest is
held back, since it may still turn into a tool call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from minivllm.serve.errors import BadRequest
from minivllm.structured_output import StructuredOutputsParams

# ---- the parsed call and the parsers -----------------------------------------------------


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    """One call, as OpenAI's ``tool_calls`` entries carry it."""

    name: str
    arguments: str
    """The arguments as a JSON text."""
    id: str = field(default_factory=new_call_id)

    @classmethod
    def from_object(cls, obj: Any, args_key: str) -> "ToolCall | None":
        """From ``{"name": ..., args_key: {...}}``; None when the object is not such a call."""
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get(args_key, obj.get("arguments", {}))
        return cls(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


class ToolParser:
    """Splits a model's chat output into content and tool calls."""

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a finished output; content None when only calls remain."""
        raise NotImplementedError

    def safe_prefix(self, text: str) -> int:
        """How many leading characters of a partial output are surely content (can be
        streamed now); the rest may still become a tool call."""
        raise NotImplementedError


def held_back(text: str, marker: str) -> int:
    """Length of ``text`` without its longest suffix that is a proper prefix of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return len(text) - k
    return len(text)


HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
_HERMES_BLOCK = re.compile(re.escape(HERMES_START) + r"(.*?)(?:" + re.escape(HERMES_END) + r"|$)", re.DOTALL)


class HermesToolParser(ToolParser):
    """Hermes / Qwen tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    blocks anywhere in the output; the text around them is the content."""

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        if HERMES_START not in text:
            return text, []
        calls = []
        for body in _HERMES_BLOCK.findall(text):
            try:
                call = ToolCall.from_object(json.loads(body.strip()), "arguments")
            except json.JSONDecodeError:
                call = None
            if call is None:
                return text, []  # a malformed block: leave the text as it is
            calls.append(call)
        content = _HERMES_BLOCK.sub("", text).strip()
        return content or None, calls

    def safe_prefix(self, text: str) -> int:
        start = text.find(HERMES_START)
        return start if start >= 0 else held_back(text, HERMES_START)


PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    """Llama 3.x JSON tool calls: the whole output is ``{"name": ..., "parameters": {...}}``
    (optionally after ``<|python_tag|>``; several calls separated by ``;``)."""

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :].strip()
        if not body.startswith("{"):
            return text, []
        calls = []
        decoder = json.JSONDecoder()
        pos = 0
        while pos < len(body):
            try:
                obj, end = decoder.raw_decode(body, pos)
            except json.JSONDecodeError:
                return text, []
            call = ToolCall.from_object(obj, "parameters")
            if call is None:
                return text, []
            calls.append(call)
            pos = end
            while pos < len(body) and body[pos] in "; \n\t":
                pos += 1
        return None, calls

    def safe_prefix(self, text: str) -> int:
        body = text.lstrip()
        if (
            not body
            or body.startswith("{")
            or PYTHON_TAG.startswith(body[: len(PYTHON_TAG)])
            or body.startswith(PYTHON_TAG)
        ):
            return 0  # may be a call: hold everything back until the end
        return len(text)


TOOL_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser}
"""Tool-call parsers by ``serve.tool_call_parser`` name (vLLM's names)."""


# ---- a request's tool plan ---------------------------------------------------------------

_ANY_OBJECT = {"type": "object"}


@dataclass
class ToolPlan:
    """What a chat request's tools ask of generation and of its output."""

    tools: list[dict[str, Any]]
    """The tools as the chat template receives them."""
    mode: str
    """none | auto | required | named"""
    named: str | None = None
    parser: ToolParser | None = None
    """The output parser (auto only)."""
    parallel: bool = True
    """``parallel_tool_calls``: false allows one call at most."""

    @property
    def constraint(self) -> StructuredOutputsParams | None:
        """Compact JSON (the text is parsed, never shown), so calls stay short."""
        if self.mode == "required":
            schema = _required_schema(self.tools, max_calls=None if self.parallel else 1)
            return StructuredOutputsParams(json=schema, disable_any_whitespace=True)
        if self.mode == "named":
            return StructuredOutputsParams(json=_parameters(self._tool(self.named)), disable_any_whitespace=True)
        return None

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of a finished output. Constrained output cut short (by
        ``max_tokens``, a stop string) is not JSON: it stays content, with no calls."""
        if self.mode in ("named", "required"):
            try:
                parsed = json.loads(text)
            except ValueError:
                return text, []
            if self.mode == "named":
                return None, [ToolCall(self.named, text)]
            return None, [ToolCall.from_object(obj, "parameters") for obj in parsed]
        if self.mode == "auto":
            content, calls = self.parser.parse(text)
            return content, calls if self.parallel else calls[:1]
        return text, []

    def _tool(self, name: str) -> dict[str, Any]:
        return next(t for t in self.tools if t["function"]["name"] == name)


def plan_tools(body: Any, parser_name: str | None) -> ToolPlan | None:
    """The request's tool plan, or None without tools; a 400 naming the field on bad input."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none"):
            raise BadRequest("tool_choice", "tool_choice: needs tools")
        return None
    tools = [_check_tool(i, t) for i, t in enumerate(body.tools)]
    names = [t["function"]["name"] for t in tools]
    choice = "auto" if choice is None else choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in names:
            raise BadRequest("tool_choice", f"tool_choice: names no tool of this request ({', '.join(names)})")
        return ToolPlan(tools, "named", named=name)
    parallel = body.parallel_tool_calls is not False
    if choice == "auto":
        if parser_name is None:
            raise BadRequest(
                "tool_choice",
                "tool_choice: 'auto' needs the server started with serve.tool_call_parser (hermes or llama3_json); "
                "'required', 'none' or a named function work without one",
            )
        return ToolPlan(tools, "auto", parser=TOOL_PARSERS[parser_name](), parallel=parallel)
    if choice in ("none", "required"):
        return ToolPlan(tools, choice, parallel=parallel)
    raise BadRequest("tool_choice", f"tool_choice={choice!r}: must be none, auto, required or a named function")


def _check_tool(i: int, tool: Any) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
        raise BadRequest("tools", f"tools[{i}]: must be {{'type': 'function', 'function': {{...}}}}")
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise BadRequest("tools", f"tools[{i}].function.name: must be a non-empty string")
    if not isinstance(fn.get("parameters", {}), dict):
        raise BadRequest("tools", f"tools[{i}].function.parameters: must be a JSON schema object")
    return {"type": "function", "function": fn}


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    return tool["function"].get("parameters") or _ANY_OBJECT


def _required_schema(tools: list[dict[str, Any]], max_calls: int | None) -> dict[str, Any]:
    """A JSON array of one or more calls, each naming a tool and matching its parameters."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]}, "parameters": _parameters(t)},
            "required": ["name", "parameters"],
        }
        for t in tools
    ]
    schema = {"type": "array", "minItems": 1, "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    return schema if max_calls is None else {**schema, "maxItems": max_calls}
