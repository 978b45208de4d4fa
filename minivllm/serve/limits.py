"""How much one HTTP request may queue, and how much the server queues in all.

Checked before a request is tokenized, so a refused request costs nothing:

- ``n`` above ``serve.max_n``: 400 (the engine's ``Processor`` applies the same
  cap, so ``LLM`` refuses it too);
- prompts x ``n`` above ``serve.max_seqs_per_request``: 400;
- more unfinished sequences than ``scheduler.max_num_seqs + serve.max_waiting``
  once this request is added: 503 with ``Retry-After``; nothing is queued;
- a text longer than ``max_model_len`` tokens could ever be: 400 before any of it
  is tokenized. No token of the tokenizer is longer than ``ServerState.max_token_chars``
  characters, so a text of more than ``max_model_len * max_token_chars`` characters
  has more than ``max_model_len`` tokens (vLLM's renderer bounds prompts the same
  way). Skipped when ``truncate_prompt_tokens`` keeps only the end of the prompt.

The body's size (``serve.max_request_bytes``) is capped before it is even read
(``body_limits.py``).

What is admitted is then scheduled fairly across client requests by the
scheduler's waiting queue (``core/request_queue.py``).
"""

from __future__ import annotations

from typing import Any, Iterable

from minivllm.serve.errors import Overloaded
from minivllm.serve.params import BadRequest
from minivllm.serve.state import ServerState

RETRY_AFTER_S = 1
"""Seconds a client is told to wait after a 503."""


def check_request_size(state: ServerState, n: int, num_prompts: int) -> None:
    """The 400s: ``n`` and prompts x ``n`` against the server's caps."""
    serve = state.cfg.serve
    if n > serve.max_n:
        raise BadRequest("n", f"n={n}: must be in [1, {serve.max_n}] (serve.max_n={serve.max_n})")
    seqs = n * num_prompts
    if seqs > serve.max_seqs_per_request:
        raise BadRequest(
            "n",
            f"n={n}: {num_prompts} prompt(s) x n = {seqs} sequences, more than one request may queue "
            f"(serve.max_seqs_per_request={serve.max_seqs_per_request})",
        )


def check_capacity(state: ServerState, num_seqs: int) -> None:
    """The 503: would ``num_seqs`` more sequences wait beyond ``serve.max_waiting``?"""
    unfinished = state.engine.get_num_unfinished_sequences()
    capacity = state.cfg.scheduler.max_num_seqs + state.cfg.serve.max_waiting
    if unfinished + num_seqs > capacity:
        raise Overloaded(
            f"the server is at capacity ({unfinished} sequences unfinished; it queues at most "
            f"scheduler.max_num_seqs + serve.max_waiting = {capacity}); retry after {RETRY_AFTER_S} s",
            retry_after=RETRY_AFTER_S,
        )


def admit(state: ServerState, n: int, num_prompts: int) -> None:
    check_request_size(state, n, num_prompts)
    check_capacity(state, n * num_prompts)


def check_text_length(state: ServerState, param: str, texts: Iterable[str], truncate: int | None = None) -> None:
    """400 naming ``param`` when ``texts`` together cannot fit the context, whatever their tokens."""
    if truncate is not None:
        return
    chars = sum(len(t) for t in texts)
    max_len, per_token = state.cfg.max_model_len, state.max_token_chars
    if chars > max_len * per_token:
        raise BadRequest(
            param,
            f"{param}: too long; {chars} characters are more than max_model_len={max_len} tokens can hold "
            f"(no token of this tokenizer is longer than {per_token} characters)",
        )


def prompt_texts(prompt: Any) -> list[str]:
    """The strings of a completion ``prompt`` or an embedding ``input`` (token ids hold none)."""
    if isinstance(prompt, str):
        return [prompt]
    return [p for p in prompt if isinstance(p, str)] if isinstance(prompt, list) else []


def message_texts(messages: Iterable[Any]) -> list[str]:
    """The text of chat messages (string content and text parts), as parsed models or dicts."""
    texts = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else m.content
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
                texts.append(text if isinstance(text, str) else "")
    return texts
