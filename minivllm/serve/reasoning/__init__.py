"""Reasoning parsers by ``serve.reasoning_parser`` name (vLLM's names)."""

from __future__ import annotations

from minivllm.serve.reasoning.think import ThinkParser, ThinkStream

REASONING_PARSERS: dict[str, ThinkParser] = {
    "deepseek_r1": ThinkParser(starts_in_prompt=True),
    "qwen3": ThinkParser(starts_in_prompt=False),
}

__all__ = ["REASONING_PARSERS", "ThinkParser", "ThinkStream"]
