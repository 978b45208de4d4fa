"""Llama 3.x JSON tool calls: the whole output is ``{"name": ..., "parameters": {...}}``
(optionally after ``<|python_tag|>``; several calls separated by ``;``)."""

from __future__ import annotations

import json

from minivllm.serve.tool_parsers.base import ToolCall, ToolParser

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
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
