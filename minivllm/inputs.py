"""Prompt shapes with vLLM's names: ``TextPrompt`` and ``TokensPrompt``.

They are plain dicts (``TypedDict``), so ``generate`` takes them as it takes
``{"prompt": ...}`` and ``{"prompt_token_ids": [...]}``::

    from minivllm.inputs import TokensPrompt
    llm.generate(TokensPrompt(prompt_token_ids=[1, 2, 3]))
"""

from __future__ import annotations

from typing import TypedDict, Union

from typing_extensions import NotRequired


class TextPrompt(TypedDict):
    """A prompt given as text; the engine tokenizes it."""

    prompt: str
    multi_modal_data: NotRequired[dict]
    """Images for a model that takes them: ``{"image": PIL.Image | [PIL.Image, ...]}``."""


class TokensPrompt(TypedDict):
    """A prompt given as token ids (``prompt`` is optional text kept with the output)."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    multi_modal_data: NotRequired[dict]


PromptType = Union[str, list[int], TextPrompt, TokensPrompt]
"""Anything ``LLM.generate`` accepts as one prompt."""

__all__ = ["PromptType", "TextPrompt", "TokensPrompt"]
