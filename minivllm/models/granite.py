"""Granite (IBM Granite 3.x dense): Llama with four scalar multipliers from muP training.

- ``embedding_multiplier`` scales the token embeddings;
- ``residual_multiplier`` scales each sublayer's output before it joins the stream;
- ``attention_multiplier`` replaces ``head_dim ** -0.5`` as the attention scale;
- ``logits_scaling`` divides the final logits.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.layers.norm import RMSNorm
from minivllm.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, LlamaModel


class GraniteDecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, layer_idx: int, **attn_opts: Any):
        super().__init__()
        self.self_attn = LlamaAttention(config, backend, **attn_opts)
        self.mlp = LlamaMLP(
            config.hidden_size, config.intermediate_size, config.hidden_act, getattr(config, "mlp_bias", False)
        )
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.residual_multiplier = config.residual_multiplier

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (the MLP's scaled output, the stream before it); the next layer adds them."""
        stream = hidden if residual is None else hidden + residual
        attn = self.self_attn(positions, self.input_layernorm(stream), meta)
        stream = stream + attn * self.residual_multiplier
        return self.mlp(self.post_attention_layernorm(stream)) * self.residual_multiplier, stream


class GraniteModel(LlamaModel):
    layer_cls = GraniteDecoderLayer

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, **attn_opts: Any) -> None:
        super().__init__(config, backend, **attn_opts)
        self.embedding_multiplier = config.embedding_multiplier

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.embedding_multiplier  # (T, hidden)


class GraniteForCausalLM(LlamaForCausalLM):
    model_cls = GraniteModel

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> dict[str, Any]:
        return {**super().attention_options(config), "scale": config.attention_multiplier}

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, hidden) -> (N, vocab) fp32
        return self.lm_head.compute_logits(hidden) / self.config.logits_scaling
