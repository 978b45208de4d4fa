"""What a model class declares beyond ``forward``: the capabilities the engine looks for.

``SupportsMultiModal``: a model that takes images. The front end asks the class for
the placeholder token (``image_token_id``); the runner asks the model for each image's
embeddings (``embed_multimodal``), embeds the step's tokens (``embed_input_ids``),
overwrites the placeholder rows with the image rows and passes the result as
``inputs_embeds``. ``SupportsMRoPE``: a model whose positions are (3, T) (Qwen2-VL).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from minivllm.multimodal.feature import MultiModalFeature


@runtime_checkable
class SupportsMultiModal(Protocol):
    supports_multimodal: ClassVar[bool]
    """True on every class that takes images (the cheap check of the runner and the front end)."""

    @classmethod
    def image_token_id(cls, hf_config: Any) -> int:
        """The prompt token the processor repeats once per embedding row of an image."""
        ...

    def embed_multimodal(self, **data: torch.Tensor) -> torch.Tensor:
        """One feature's processed tensors (``MultiModalFeature.data``) -> (length, hidden) embeddings.
        A class with ``batches_multimodal = True`` also takes several features' tensors concatenated
        along dim 0 (``multimodal/feature.py``: ``encoder_batches``) and returns their rows
        concatenated in order."""
        ...

    @classmethod
    def profile_image_size(cls, hf_config: Any, image_processor: Any, max_tokens: int) -> tuple[int, int] | None:
        """(width, height) of an image that the processor turns into the most placeholder tokens,
        at most ``max_tokens``; None when every image takes more. The start-up memory profile
        encodes as many of these as one step may (``worker/profile.py``)."""
        ...

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(N,) token ids -> (N, hidden) the first decoder layer would see."""
        ...


@runtime_checkable
class SupportsMRoPE(Protocol):
    supports_mrope: ClassVar[bool]

    def get_mrope_input_positions(
        self, prompt_token_ids: list[int], mm_features: list[MultiModalFeature]
    ) -> tuple[torch.Tensor, int]:
        """(3, L) positions of the prompt, and the delta: decode position p is ``p + delta`` in all three rows."""
        ...


def supports_multimodal(model: Any) -> bool:
    """Whether a model (class or instance) takes images."""
    return bool(getattr(model, "supports_multimodal", False))


def batches_multimodal(model: Any) -> bool:
    """Whether one ``embed_multimodal`` call of a model (class or instance) may take several images."""
    return bool(getattr(model, "batches_multimodal", False))


def supports_mrope(model: Any) -> bool:
    """Whether a model (class or instance) takes (3, T) multimodal rotary positions."""
    return bool(getattr(model, "supports_mrope", False))
