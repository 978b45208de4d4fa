"""Hermes / Qwen tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
blocks anywhere in the output; the text around them is the content."""

from __future__ import annotations

import json
import re

from minivllm.serve.tool_parsers.base import ToolCall, ToolParser, held_back

START, END = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(START) + r"(.*?)(?:" + re.escape(END) + r"|$)", re.DOTALL)


class HermesToolParser(ToolParser):
    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        if START not in text:
            return text, []
        calls = []
        for body in _BLOCK.findall(text):
            try:
                call = ToolCall.from_object(json.loads(body.strip()), "arguments")
            except json.JSONDecodeError:
                call = None
            if call is None:
                return text, []  # a malformed block: leave the text as it is
            calls.append(call)
        content = _BLOCK.sub("", text).strip()
        return content or None, calls

    def safe_prefix(self, text: str) -> int:
        start = text.find(START)
        return start if start >= 0 else held_back(text, START)
