"""One image of a request, processed: what the scheduler and the workers carry.

The front end (``engine/processor.py``) runs the checkpoint's processor once per
request; every image becomes a ``MultiModalFeature`` whose placeholder tokens
already sit in the prompt's token ids. The scheduler reads only ``offset``,
``length`` and ``identifier`` (when to run the encoder, how much encoder budget
and cache it takes, the prefix-cache key); the workers read ``data``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(eq=False)
class MultiModalFeature:
    """Invariant: ``prompt_token_ids[offset : offset + length]`` are the image's placeholder
    tokens, and the vision encoder turns ``data`` into ``length`` rows of embeddings."""

    identifier: str
    """Content hash of the image's pixels and the processor options (the encoder-cache and
    prefix-cache key: the same image in two requests has the same identifier)."""
    modality: str
    """"image" (the only modality so far)."""
    offset: int
    """Index in the prompt's token ids of the first placeholder token."""
    length: int
    """Placeholder tokens, equal to the rows of embeddings the encoder returns."""
    data: dict[str, torch.Tensor] = field(default_factory=dict)
    """This image's processed tensors, e.g. ``pixel_values`` (1, 3, H, W); Qwen2-VL adds ``image_grid_thw``."""

    @property
    def end(self) -> int:
        """One past the last placeholder token."""
        return self.offset + self.length

    def overlaps(self, start: int, stop: int) -> bool:
        """Whether token positions ``[start, stop)`` hold any of this image's placeholders."""
        return start < self.end and self.offset < stop
