"""What every tool-call parser shares: the parsed call, and holding back streamed
text that may turn out to be a tool call."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


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
