"""``<think>...</think>`` reasoning (Qwen3, DeepSeek-R1): the text inside goes to
``reasoning_content``, the text after ``</think>`` to ``content``.

DeepSeek-R1's template opens ``<think>`` in the prompt, so its output may begin
inside the reasoning with no opening tag (``starts_in_prompt``): there, text with
no ``</think>`` yet is reasoning. For Qwen3, output that does not open with
``<think>`` is plain content (thinking switched off). ``REASONING_PARSERS`` names
them by ``serve.reasoning_parser`` (vLLM's names).
"""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.serve.tools import held_back

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ThinkParser:
    starts_in_prompt: bool

    def split(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a finished output; None where there is none."""
        body = text.lstrip()
        opened = body.startswith(START)
        if opened:
            body = body[len(START) :]
        elif not self.starts_in_prompt:
            return None, text
        reasoning, sep, content = body.partition(END)
        if not sep and not opened and not self.starts_in_prompt:
            return None, text
        return reasoning.strip("\n") or None, content.lstrip("\n") or None

    def stream(self) -> "ThinkStream":
        return ThinkStream(self)


class ThinkStream:
    """Splits streamed text into (reasoning delta, content delta), holding back
    text that may be the start of a tag."""

    def __init__(self, parser: ThinkParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent_reasoning = 0
        """Characters of the reasoning already sent."""
        self.sent_content = 0

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        self.text += delta
        body = self.text.lstrip()
        if not final and len(body) < len(START) and START.startswith(body):
            return "", ""  # too early to tell whether it opens with <think>
        opened = body.startswith(START)
        if not opened and not self.parser.starts_in_prompt:
            return "", self._content(self.text, final)
        inner = body[len(START) :] if opened else body
        end = inner.find(END)
        if end < 0:
            safe = len(inner) if final else held_back(inner, END)
            return self._reasoning(inner[:safe]), ""
        return self._reasoning(inner[:end]), self._content(inner[end + len(END) :].lstrip("\n"), final)

    def _reasoning(self, reasoning: str) -> str:
        reasoning = reasoning.strip("\n")  # as split() does; a newline is sent once text follows it
        out, self.sent_reasoning = reasoning[self.sent_reasoning :], max(self.sent_reasoning, len(reasoning))
        return out

    def _content(self, content: str, final: bool) -> str:
        out, self.sent_content = content[self.sent_content :], max(self.sent_content, len(content))
        return out


REASONING_PARSERS: dict[str, ThinkParser] = {
    "deepseek_r1": ThinkParser(starts_in_prompt=True),
    "qwen3": ThinkParser(starts_in_prompt=False),
}
