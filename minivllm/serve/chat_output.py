"""A chat choice's text -> ``reasoning_content``, ``content`` and ``tool_calls``,
whole or streamed (deltas).

The reasoning parser (``serve.reasoning_parser``) splits first; the tool plan
then reads the content. Streamed content that may still turn into a tool call
is held back until it is clear; calls are sent whole, one delta each, when the
choice ends. A named function's call too: its arguments are held until they
parse, so a choice cut short by ``max_tokens`` never streams a call whose
arguments do not parse (its text goes out as content, with ``finish_reason``
"length").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.serve.protocol import DeltaFunctionCall, DeltaMessage, DeltaToolCall, FunctionCall, ToolCallOut
from minivllm.serve.reasoning import ThinkParser
from minivllm.serve.tool_parsers import ToolCall
from minivllm.serve.tools import ToolPlan


@dataclass
class ParsedChoice:
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] = field(default_factory=list)


def tool_calls_out(calls: list[ToolCall]) -> list[ToolCallOut]:
    return [ToolCallOut(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls]


class ChatOutputParser:
    def __init__(self, tools: ToolPlan | None, reasoning: ThinkParser | None) -> None:
        self.tools, self.reasoning = tools, reasoning

    def finish_reason(self, reason: str | None, parsed_calls: bool) -> str | None:
        """OpenAI's "tool_calls" when the model chose to call (auto, required)."""
        if parsed_calls and reason == "stop" and self.tools is not None and self.tools.mode in ("auto", "required"):
            return "tool_calls"
        return reason

    def whole(self, text: str) -> ParsedChoice:
        reasoning, content = self.reasoning.split(text) if self.reasoning else (None, text)
        if self.tools is None or content is None:
            return ParsedChoice(content, reasoning)
        content, calls = self.tools.parse(content)
        return ParsedChoice(content, reasoning, tool_calls_out(calls))

    def stream(self) -> "ChoiceStream":
        return ChoiceStream(self)


class ChoiceStream:
    """One choice's deltas: feed each new piece of text, the last with ``final``."""

    def __init__(self, parser: ChatOutputParser) -> None:
        self.parser = parser
        self.think = parser.reasoning.stream() if parser.reasoning else None
        self.content = ""
        """All content so far (after reasoning)."""
        self.sent = 0
        """Characters of ``content`` already sent."""
        self.has_calls = False

    def feed(self, delta: str, final: bool) -> DeltaMessage | None:
        reasoning, content = self.think.feed(delta, final) if self.think else ("", delta)
        self.content += content
        out = DeltaMessage(reasoning_content=reasoning or None)
        tools = self.parser.tools
        if tools is None or tools.mode == "none":
            out.content = self._send(len(self.content))
        elif not final:
            safe = tools.parser.safe_prefix(self.content) if tools.mode == "auto" else 0
            out.content = self._send(safe)
        else:
            self._finish_tools(tools, out)
        return out if out.content or out.reasoning_content or out.tool_calls else None

    def _finish_tools(self, tools: ToolPlan, out: DeltaMessage) -> None:
        rest, calls = tools.parse(self.content)
        sent = self.content[: self.sent]
        if rest is not None and rest.startswith(sent):
            out.content = rest[len(sent) :] or None
        self.has_calls = bool(calls)
        out.tool_calls = [
            DeltaToolCall(index=i, id=c.id, function=DeltaFunctionCall(name=c.name, arguments=c.arguments))
            for i, c in enumerate(calls)
        ] or None

    def _send(self, upto: int) -> str | None:
        if upto <= self.sent:
            return None
        piece, self.sent = self.content[self.sent : upto], upto
        return piece
