"""Tool calling in chat completions: checking ``tools`` and ``tool_choice``, the
constraint that enforces ``required`` and a named function, and turning the
output into OpenAI ``tool_calls``.

- ``none``: no calls are parsed; the text is the content.
- ``auto`` (the default when tools are given): the model decides; its output is
  read by ``serve.tool_call_parser``.
- ``required``: the output is constrained to a JSON array of
  ``{"name": <a tool>, "parameters": <its arguments>}`` (at least one).
- a named function: the output is constrained to that tool's parameters schema;
  it is the call's arguments.

Constrained output that finished parses; output cut short (``finish_reason``
"length") does not, and is returned as content with no calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from minivllm.serve.params import BadRequest
from minivllm.serve.tool_parsers import TOOL_PARSERS, ToolCall, ToolParser
from minivllm.structured_output import StructuredOutputsParams

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
