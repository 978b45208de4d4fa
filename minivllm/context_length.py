"""The context-window checks, worded as vLLM words them for each front end.

A generating request needs its prompt plus at least one token to fit
``max_model_len`` (the engine caps ``max_tokens`` at the room left; the server
refuses a ``max_tokens`` that does not fit); a pooling request generates
nothing, so its input may fill the context exactly.

The refusal carries its numbers; its message is the offline one (vLLM's
``LLM``: "The decoder prompt (length N) is longer than the maximum model
length of M"). The server rewords it with ``served_message`` in OpenAI's
wording, which clients (litellm, LangChain) recognise as a context-window
error and trim: "messages" on the chat route, "prompt" on the completions route.
"""

from __future__ import annotations

from typing import Literal

Subject = Literal["messages", "prompt"]
"""What the server calls the input: a chat request's messages, a completion's prompt."""


class ContextLengthExceeded(ValueError):
    """A prompt (plus the tokens asked for) longer than the model's context."""

    def __init__(self, message: str, param: str, num_prompt_tokens: int, completion: int, max_model_len: int) -> None:
        super().__init__(message)
        self.param = param
        """The request field to blame: the prompt, or max_tokens when the prompt alone fits."""
        self.num_prompt_tokens = num_prompt_tokens
        self.completion = completion
        """Tokens asked for beyond the prompt (at least 1 for a generating request, 0 for pooling)."""
        self.max_model_len = max_model_len


def check_prompt_fits(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
    """The prompt must leave room for one generated token (``max_tokens`` is capped later)."""
    if num_prompt_tokens >= max_model_len:
        plus = " plus the number of requested output tokens (at least 1)" if num_prompt_tokens == max_model_len else ""
        message = f"The decoder prompt (length {num_prompt_tokens}){plus} " + _longer(max_model_len)
        raise ContextLengthExceeded(message, "prompt", num_prompt_tokens, max(1, max_tokens or 1), max_model_len)


def check_request_fits(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """The prompt and all of ``max_tokens`` must fit (a client that asked for them gets no fewer)."""
    if num_prompt_tokens + max_tokens > max_model_len:
        check_prompt_fits(num_prompt_tokens, max_tokens, max_model_len)
        message = f"The decoder prompt (length {num_prompt_tokens}) plus max_tokens={max_tokens} " + _longer(
            max_model_len
        )
        raise ContextLengthExceeded(message, "max_tokens", num_prompt_tokens, max_tokens, max_model_len)


def check_pooling_fits(num_prompt_tokens: int, max_model_len: int) -> None:
    """A pooling input may fill the context, not overflow it."""
    if num_prompt_tokens > max_model_len:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens} tokens in the input for embedding generation. Please reduce the length of the input.",
            "prompt",
            num_prompt_tokens,
            0,
            max_model_len,
        )


def served_message(err: ContextLengthExceeded, subject: Subject) -> str:
    """OpenAI's wording of a generating request's refusal, speaking of ``subject``."""
    if not err.completion:
        return str(err)
    n, completion = err.num_prompt_tokens, err.completion
    return (
        f"This model's maximum context length is {err.max_model_len} tokens. However, you requested "
        f"{n + completion} tokens ({n} in the {subject}, {completion} in the completion). "
        f"Please reduce the length of the {subject} or completion."
    )


def _longer(max_model_len: int) -> str:
    return (
        f"is longer than the maximum model length of {max_model_len}. "
        "Make sure that `max_model_len` is no smaller than the number of text tokens."
    )
