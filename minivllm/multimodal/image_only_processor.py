"""An image-and-text processor built from a checkpoint's tokenizer and image processor alone.

transformers builds ``Qwen2VLProcessor`` only when torchvision is installed (its video
half needs it), although images go through the PIL image processor. Without
torchvision the front end uses this instead: the checkpoint's own image processor
(``AutoImageProcessor``: resizing, patches, ``image_grid_thw``) and tokenizer, with
each image token of the text repeated once per embedding row of its image, the
rule of the model's own processor (Qwen2-VL: ``t * h * w / merge_size^2``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

TokensPerImage = Callable[[Any, dict[str, torch.Tensor], int], int]
"""(image processor, its output, image index) -> placeholder tokens of that image."""


def merged_grid_tokens(image_processor: Any, out: dict[str, torch.Tensor], index: int) -> int:
    """Qwen2-VL: one token per ``merge_size x merge_size`` block of the image's patch grid."""
    return int(out["image_grid_thw"][index].prod()) // image_processor.merge_size**2


TOKENS_PER_IMAGE: dict[str, TokensPerImage] = {"Qwen2VLForConditionalGeneration": merged_grid_tokens}
"""Architectures this processor stands in for, and their expansion rule."""


class ImageOnlyProcessor:
    """Called like a transformers processor: ``(text=..., images=[...], return_tensors="pt")``."""

    def __init__(self, tokenizer: Any, image_processor: Any, image_token: str, tokens_per_image: TokensPerImage):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.image_token = image_token
        self.tokens_per_image = tokens_per_image

    @classmethod
    def from_pretrained(cls, path: str, architecture: str, image_token_id: int, **kwargs: Any) -> "ImageOnlyProcessor":
        from transformers import AutoImageProcessor, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        image_processor = AutoImageProcessor.from_pretrained(path, **kwargs)
        token = tokenizer.convert_ids_to_tokens(image_token_id)
        return cls(tokenizer, image_processor, token, TOKENS_PER_IMAGE[architecture])

    def __call__(self, text: str, images: list[Any], return_tensors: str = "pt") -> dict[str, torch.Tensor]:
        out = dict(self.image_processor(images=images, return_tensors=return_tensors))
        pieces = text.split(self.image_token)
        if len(pieces) - 1 != len(images):
            raise ValueError(f"{len(images)} image(s) for {len(pieces) - 1} {self.image_token!r} token(s) in the text")
        expanded = pieces[0]
        for i, piece in enumerate(pieces[1:]):
            expanded += self.image_token * self.tokens_per_image(self.image_processor, out, i) + piece
        ids = self.tokenizer(expanded, add_special_tokens=False, return_tensors=return_tensors)
        return {**ids, **out}
