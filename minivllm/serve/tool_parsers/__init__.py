"""Tool-call parsers by ``serve.tool_call_parser`` name (vLLM's names)."""

from __future__ import annotations

from minivllm.serve.tool_parsers.base import ToolCall, ToolParser
from minivllm.serve.tool_parsers.hermes import HermesToolParser
from minivllm.serve.tool_parsers.llama3_json import Llama3JsonToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesToolParser, "llama3_json": Llama3JsonToolParser}

__all__ = ["TOOL_PARSERS", "ToolCall", "ToolParser"]
