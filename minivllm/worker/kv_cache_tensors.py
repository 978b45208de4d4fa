"""The KV cache's tensors: one (2, num_blocks, block_size, kv_heads, head_dim) tensor per
attention layer, bound to the layer (``Attention.kv_cache``), which writes and reads it.

Sleep mode unbinds them (the memory goes back) and binds fresh ones on wake-up.
"""

from __future__ import annotations

import torch

from minivllm.layers.attention import Attention


def kv_cache_shape(layers: list[Attention], num_blocks: int, block_size: int) -> tuple[int, ...]:
    layer = layers[0]
    return (2, num_blocks, block_size, layer.num_kv_heads, layer.head_dim)


def bind_kv_caches(
    layers: list[Attention], shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """Allocate one zeroed tensor of ``shape`` per layer and bind it; returns them."""
    caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in layers]
    for layer, cache in zip(layers, caches):
        layer.kv_cache = cache
    return caches


def unbind_kv_caches(layers: list[Attention]) -> None:
    for layer in layers:
        layer.kv_cache = None
