"""One image of a request, processed: what the scheduler and the workers carry.

The front end (``engine/processor.py``) runs the checkpoint's processor once per
request; every image becomes a ``MultiModalFeature`` whose placeholder tokens
already sit in the prompt's token ids. The scheduler reads only ``offset``,
``length`` and ``identifier`` (when to run the encoder, how much encoder budget
and cache it takes, the prefix-cache key); the workers read ``data``.

A feature crosses to the engine process (and on to workers) pickled: its tensors travel
as their bytes inside the message. Pickled through ``multiprocessing``, a torch tensor
would instead move to shared memory and leave a descriptor in the sending process for
every distinct image (a server fed enough images runs out of descriptors).
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
