"""The Multi-head Latent Attention layer (DeepSeek V2/V3): a latent cache, two attention forms.

Like ``Attention`` it owns its slice of the paged cache, but the slice holds one
latent per token (``kv_lora_rank + qk_rope_head_dim`` values, shared by every
head) instead of per-head keys and values, so ``kv_cache_shape`` differs and the
backend's ``forward_mla`` serves it (``attention/mla.py``). Under tensor
parallelism the latent is replicated on every rank and the heads are split: the
layer holds its ranks' heads of ``W_UK`` / ``W_UV``.
"""

from __future__ import annotations

import torch

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.attention.kv_quant import is_fp8
from minivllm.layers.attention import Attention


class MLAAttention(Attention):
    def __init__(
        self,
        backend: AttentionBackend,
        num_heads: int,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        scale: float,
    ) -> None:
        """``num_heads``: this rank's query heads; ``scale``: the softmax scale (DeepSeek's yarn mscale applied)."""
        super().__init__(backend, num_heads, kv_lora_rank + qk_rope_head_dim, 1, scale)
        self.kv_lora_rank, self.v_head_dim = kv_lora_rank, v_head_dim
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """One latent "head" per token: (num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim)."""
        return (num_blocks, block_size, 1, self.head_dim)

    def forward_latent(
        self,
        q_nope: torch.Tensor,  # (T, H, dn)
        q_pe: torch.Tensor,  # (T, H, dr), rotated
        latent: torch.Tensor,  # (T, r + dr): normalized c, rotated k_pe
        kv_b_weight: torch.Tensor,  # (H * (dn + dv), r): this rank's heads of kv_b_proj
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # (T, H * dv)
        if self.kv_cache is None:
            raise RuntimeError("the KV cache is not allocated: the model runner binds it in init_kv_cache()")
        T, H = q_nope.shape[0], self.num_heads
        w_kv = kv_b_weight.view(H, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        out = self.backend.forward_mla(
            q_nope,
            q_pe,
            latent,
            self.kv_cache,
            meta,
            w_uk=w_kv[:, : self.qk_nope_head_dim],  # (H, dn, r)
            w_uv=w_kv[:, self.qk_nope_head_dim :],  # (H, dv, r)
            scale=self.scale,
            k_scale=self.k_scale if is_fp8(self.kv_cache) else 1.0,
        )
        return out.reshape(T, H * self.v_head_dim)
