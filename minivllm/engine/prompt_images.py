"""A prompt's images: ``multi_modal_data`` through the checkpoint's processor.

A prompt with images is split into text and ids as any other, then the model's
processor expands each image placeholder into the image's tokens and returns
one ``MultiModalFeature`` per image (what the scheduler and the encoder cache
run). The rules: a text-only model refuses images; a prompt that holds
placeholder tokens must bring its images; ``truncate_prompt_tokens`` cannot be
combined with images (it could cut one in half).
"""

from __future__ import annotations

from minivllm.engine.prompt_tokens import PromptTokenizer, PromptType
from minivllm.multimodal.feature import MultiModalFeature
from minivllm.multimodal.processing import MultiModalProcessor


def tokenize_with_images(
    prompts: PromptTokenizer,
    mm: MultiModalProcessor | None,
    architecture: str,
    prompt: PromptType,
    truncate_prompt_tokens: int | None,
) -> tuple[str | None, list[int], list[MultiModalFeature]]:
    """``prompts.tokenize``, then a prompt's ``multi_modal_data`` through ``mm`` (None: the model
    takes no images)."""
    mm_data = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
    if mm_data is None:
        text, ids = prompts.tokenize(prompt, truncate_prompt_tokens)
        if mm is not None and mm.image_token_id in ids:
            raise ValueError(
                f"prompt: holds image placeholder tokens ({mm.image_token!r}) but no image was given; "
                "pass the images in multi_modal_data (or image_url content parts)"
            )
        return text, ids, []
    if mm is None:
        raise ValueError(f"multi_modal_data: {architecture} takes no images; send text only")
    if truncate_prompt_tokens is not None:
        raise ValueError("truncate_prompt_tokens: cannot be combined with multi_modal_data (it could cut an image)")
    text, ids = prompts.split(prompt)
    ids, features = mm.process(ids, mm_data)
    prompts.check_ids(ids)
    return text, ids, features
