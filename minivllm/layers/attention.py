"""The attention layer a model calls: reshape, then hand off to the backend.

The layer owns its slice of the paged KV cache (``kv_cache``), bound by the
model runner after the cache is allocated. Queries, keys and values arrive
already projected (and rotated) as flat ``(T, heads * head_dim)`` tensors.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.attention.kv_quant import is_fp8


class Attention(nn.Module):
    def __init__(
        self,
        backend: AttentionBackend,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int,
        scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        self.backend = backend
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.scale = scale
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.kv_cache: torch.Tensor | None = None  # (2, num_blocks, block_size, num_kv_heads, head_dim)
        self.k_scale, self.v_scale = 1.0, 1.0  # fp8 KV cache: stored = k / k_scale (attention/kv_quant.py)

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """This layer's slice of the paged cache: (2, num_blocks, block_size, num_kv_heads, head_dim)."""
        return (2, num_blocks, block_size, self.num_kv_heads, self.head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        if self.kv_cache is None:
            raise RuntimeError("the KV cache is not allocated: the model runner binds it in init_kv_cache()")
        T = q.shape[0]
        scales = {"k_scale": self.k_scale, "v_scale": self.v_scale} if is_fp8(self.kv_cache) else {}
        out = self.backend.forward(
            q.view(T, self.num_heads, self.head_dim),
            k.view(T, self.num_kv_heads, self.head_dim),
            v.view(T, self.num_kv_heads, self.head_dim),
            self.kv_cache,
            meta,
            scale=self.scale,
            sliding_window=self.sliding_window,
            logits_soft_cap=self.logits_soft_cap,
            **scales,
        )
        return out.reshape(T, self.num_heads * self.head_dim)


def attention_layers(model: nn.Module) -> list[Attention]:
    """The model's attention layers in module order: the ones that hold a slice of the KV cache."""
    return [m for m in model.modules() if isinstance(m, Attention)]


def uniform_sliding_window(model: nn.Module) -> int | None:
    """The widest window when every attention layer of ``model`` has one; None when any attends
    globally (or there is none). The worker reports it in its ``KVCacheSpec``."""
    windows = [m.sliding_window for m in attention_layers(model)]
    if not windows or any(w is None for w in windows):
        return None
    return max(windows)
