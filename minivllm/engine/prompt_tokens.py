"""A prompt as the engine takes it -> (text, token ids), checked against the vocabulary.

A prompt is a string, a list of token ids, or a dict with ``prompt`` (text)
and/or ``prompt_token_ids`` (given ids win over the text, which is then only
reported back). A text prompt is tokenized here, once, with the tokenizer's
special tokens. Every id list that leaves this module is non-empty and inside
``[0, vocab_size)``; ``truncate_prompt_tokens`` is applied before that check.

As in vLLM, emptiness is a property of the token ids, not of the text: ``""``
is served when the tokenizer adds a BOS token (it tokenizes to ``[bos]``), and
refused when its tokenization is empty, as ``prompt_token_ids=[]`` is.
"""

from __future__ import annotations

import operator
from typing import Any, Union

from transformers import PreTrainedTokenizerBase

PromptType = Union[str, dict[str, Any], list[int]]
"""A string, ``{"prompt": str}``, ``{"prompt_token_ids": [...]}`` (either with ``"multi_modal_data"``)
or a list of token ids."""
PROMPT_KEYS = ("prompt", "prompt_token_ids", "multi_modal_data")
"""The keys of a prompt dict the engine handles; any other is refused."""
EMPTY_IDS = "prompt_token_ids: is empty and the decoder prompt cannot be empty; give at least one token id"


class PromptTokenizer:
    """The tokenizer and vocabulary a processor checks prompts against."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size

    def tokenize(self, prompt: PromptType, truncate_prompt_tokens: int | None = None) -> tuple[str | None, list[int]]:
        """(text, token ids); ``truncate_prompt_tokens`` keeps only the last k ids (before the checks)."""
        text, ids = self.split(prompt)
        if truncate_prompt_tokens is not None:
            ids = ids[-truncate_prompt_tokens:]
        self.check_ids(ids)
        return text, ids

    def split(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt, unchecked; text is None for token ids only."""
        if isinstance(prompt, dict) and (unknown := sorted(set(prompt) - set(PROMPT_KEYS))):
            raise ValueError(
                f"prompt: key(s) {', '.join(map(repr, unknown))} not supported by this engine; "
                f"a prompt dict may hold {' and '.join(PROMPT_KEYS)}"
            )
        if isinstance(prompt, str):
            text, ids = prompt, self._encode(prompt)
            if not ids:
                raise ValueError(
                    f"prompt: {prompt!r} tokenizes to no tokens (this tokenizer adds no BOS token) and the "
                    "decoder prompt cannot be empty; give text that tokenizes to at least one token"
                )
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = prompt.get("prompt"), _as_token_ids(prompt["prompt_token_ids"])
        elif isinstance(prompt, dict) and "prompt" in prompt:
            return self.split(prompt["prompt"])
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            text, ids = None, list(prompt)
        else:
            raise ValueError(
                f"prompt: expected a string, a list of token ids, or a dict with 'prompt' or 'prompt_token_ids'; "
                f"got {type(prompt).__name__}"
            )
        if not ids:
            raise ValueError(EMPTY_IDS)
        return text, ids

    def _encode(self, text: str) -> list[int]:
        """Token ids; transformers' too-long warning is off (the context checks say it better)."""
        return self.tokenizer.encode(text, add_special_tokens=True, verbose=False)

    def check_ids(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError(EMPTY_IDS)
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids: {bad[:5]} outside the vocabulary [0, {self.vocab_size})")


def _as_token_ids(ids: Any) -> list[int]:
    """``prompt_token_ids`` as Python ints: numpy and torch integers (arrays too) are integers."""
    try:
        return [operator.index(t) for t in ids]
    except TypeError:
        raise ValueError(
            f"prompt_token_ids: must be a list of integer token ids; got {type(ids).__name__} {str(ids)[:80]}"
        ) from None
