"""The context-window checks, worded as OpenAI and vLLM word them so that clients
(litellm, LangChain) recognise a context-window error and can trim the messages.

A generating request needs its prompt plus at least one token to fit
``max_model_len`` (the engine caps ``max_tokens`` at the room left; the server
refuses a ``max_tokens`` that does not fit); a pooling request generates
nothing, so its input may fill the context exactly.
"""

from __future__ import annotations


class ContextLengthExceeded(ValueError):
    """A prompt (plus the tokens asked for) longer than the model's context."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param
        """The request field to blame: the prompt, or max_tokens when the prompt alone fits."""


def check_prompt_fits(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
    """The prompt must leave room for one generated token (``max_tokens`` is capped later)."""
    if num_prompt_tokens >= max_model_len:
        raise _exceeded(num_prompt_tokens, max(1, max_tokens or 1), max_model_len, "prompt")


def check_request_fits(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """The prompt and all of ``max_tokens`` must fit (a client that asked for them gets no fewer)."""
    if num_prompt_tokens + max_tokens > max_model_len:
        param = "prompt" if num_prompt_tokens >= max_model_len else "max_tokens"
        raise _exceeded(num_prompt_tokens, max_tokens, max_model_len, param)


def check_pooling_fits(num_prompt_tokens: int, max_model_len: int) -> None:
    """A pooling input may fill the context, not overflow it."""
    if num_prompt_tokens > max_model_len:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens} tokens in the input for embedding generation. Please reduce the length of the input.",
            "prompt",
        )


def _exceeded(num_prompt_tokens: int, completion: int, max_model_len: int, param: str) -> ContextLengthExceeded:
    return ContextLengthExceeded(
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{num_prompt_tokens + completion} tokens ({num_prompt_tokens} in the messages, {completion} in the "
        "completion). Please reduce the length of the messages or completion.",
        param,
    )
