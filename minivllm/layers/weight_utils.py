"""Copying (a shard of) a checkpoint tensor into a parameter.

``loaded`` is a ``torch.Tensor`` or a safetensors slice (from ``safe_open(...).get_slice``):
both support basic indexing, and with a slice only the rank's shard is read from disk.
"""

from __future__ import annotations

from typing import Any

import torch


def loaded_shape(loaded: Any) -> tuple[int, ...]:
    return tuple(loaded.shape) if isinstance(loaded, torch.Tensor) else tuple(loaded.get_shape())


def narrow(loaded: Any, dim: int, start: int, size: int) -> torch.Tensor:
    """``loaded[..., start:start+size, ...]`` along ``dim`` as a tensor."""
    index = [slice(None)] * len(loaded_shape(loaded))
    index[dim] = slice(start, start + size)
    return loaded[tuple(index)]


def as_tensor(loaded: Any) -> torch.Tensor:
    return loaded if isinstance(loaded, torch.Tensor) else loaded[...]  # [...] also reads 0-d tensors


def copy_checked(param: torch.Tensor, value: torch.Tensor, name: str = "") -> None:
    if tuple(param.shape) != tuple(value.shape):
        raise ValueError(
            f"weight {name or '?'}: checkpoint shape {tuple(value.shape)} != parameter {tuple(param.shape)}"
        )
    param.data.copy_(value)


def default_weight_loader(param: torch.nn.Parameter, loaded: Any) -> None:
    """For parameters of layers without their own ``weight_loader`` (norms): copy whole."""
    copy_checked(param, as_tensor(loaded))


class Transposed:
    """A 2-D checkpoint tensor stored as (in, out) (GPT-2's ``Conv1D``) seen as the
    (out, in) weight our linear layers expect. Lazy like a safetensors slice: a
    layer's ``narrow`` reads only its shard, transposed on the way out."""

    def __init__(self, loaded: Any) -> None:
        shape = loaded_shape(loaded)
        if len(shape) != 2:
            raise ValueError(f"Transposed: expected a 2-D tensor, got shape {shape}")
        self.loaded = loaded

    def get_shape(self) -> tuple[int, int]:
        rows, cols = loaded_shape(self.loaded)
        return cols, rows

    def __getitem__(self, index: Any) -> torch.Tensor:
        if not isinstance(index, tuple):
            index = (index,)
        index = tuple(i for i in index if i is not Ellipsis)  # [...] reads the whole tensor
        rows, cols = (*index, slice(None), slice(None))[:2]
        return self.loaded[cols, rows].t()  # a tensor or a safetensors slice read
