"""One image of a request, processed: what the scheduler and the workers carry, and
how several of them share one vision-encoder call.

The front end (``engine/processor.py``) runs the checkpoint's processor once per
request; every image becomes a ``MultiModalFeature`` whose placeholder tokens
already sit in the prompt's token ids. The scheduler reads only ``offset``,
``length`` and ``identifier`` (when to run the encoder, how much encoder budget
and cache it takes, the prefix-cache key); the workers read ``data``.

Several images in one encoder call (``encoder_batches``, ``joined_data``): a model
that ``batches_multimodal`` takes, in one ``embed_multimodal`` call, the tensors of
several images concatenated along dim 0, and returns their embedding rows
concatenated in the same order::

    LLaVA      pixel_values (1, 3, H, W) each      -> (B, 3, H, W): the images must share H, W
    Qwen2-VL   pixel_values (patches_i, C*T*P*P)   -> (sum of patches, C*T*P*P), any sizes;
               image_grid_thw (1, 3) each          -> (B, 3): the ViT keeps images apart by cu_seqlens

So images join one call when every tensor agrees with the others' beyond dim 0 (the same
keys, dtypes and trailing shapes); a model without the capability gets one image per call.

A feature crosses to the engine process (and on to workers) pickled: its tensors travel
as their bytes inside the message. Pickled through ``multiprocessing``, a torch tensor
would instead move to shared memory and leave a descriptor in the sending process for
every distinct image (a server fed enough images runs out of descriptors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

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

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["data"] = {name: _TensorBytes.of(t) for name, t in self.data.items()}
        return state

    def __setstate__(self, state: dict) -> None:
        state["data"] = {name: packed.tensor() for name, packed in state["data"].items()}
        self.__dict__.update(state)

    @property
    def end(self) -> int:
        """One past the last placeholder token."""
        return self.offset + self.length

    def overlaps(self, start: int, stop: int) -> bool:
        """Whether token positions ``[start, stop)`` hold any of this image's placeholders."""
        return start < self.end and self.offset < stop


def encoder_batches(features: Sequence[MultiModalFeature], batched: bool) -> list[list[int]]:
    """Indices into ``features``, one list per encoder call, in first-appearance order: images
    whose tensors join along dim 0 share a call (when ``batched``), the rest go alone."""
    if not batched:
        return [[i] for i in range(len(features))]
    groups: dict[Hashable, list[int]] = {}
    for i, feature in enumerate(features):
        groups.setdefault(_join_key(feature, i), []).append(i)
    return list(groups.values())


def joined_data(features: Sequence[MultiModalFeature]) -> dict[str, torch.Tensor]:
    """The images' tensors concatenated along dim 0 (one image's tensors as they are)."""
    if len(features) == 1:
        return dict(features[0].data)
    return {key: torch.cat([f.data[key] for f in features]) for key in features[0].data}


def _join_key(feature: MultiModalFeature, index: int) -> Hashable:
    """Equal for images that concatenate; a 0-d tensor joins nothing (keyed by its index)."""
    if any(t.dim() == 0 for t in feature.data.values()):
        return ("alone", index)
    return tuple(sorted((key, t.dtype, tuple(t.shape[1:])) for key, t in feature.data.items()))


@dataclass(frozen=True)
class _TensorBytes:
    """A CPU tensor as plain bytes (dtype, shape, raw): what pickles into a message."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    raw: bytes

    @staticmethod
    def of(tensor: torch.Tensor) -> _TensorBytes:
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        return _TensorBytes(tensor.dtype, tuple(tensor.shape), flat.view(torch.uint8).numpy().tobytes())

    def tensor(self) -> torch.Tensor:
        if not self.raw:
            return torch.empty(self.shape, dtype=self.dtype)
        return torch.frombuffer(bytearray(self.raw), dtype=torch.uint8).view(self.dtype).reshape(self.shape)
