"""Gemma 2: a Llama-shaped decoder with Gemma's quirks.

- RMSNorm scales by ``1 + weight`` (``GemmaRMSNorm``), and every layer has four
  of them: before and after attention, before and after the MLP.
- The embeddings are multiplied by ``sqrt(hidden_size)`` (rounded to the model dtype).
- Attention scores are scaled by ``query_pre_attn_scalar ** -0.5`` and soft-capped,
  ``cap * tanh(score / cap)`` with ``attn_logit_softcapping``; the final logits
  likewise with ``final_logit_softcapping``.
- Layers alternate sliding-window and global attention (``layer_types``).
- The MLP is gated GELU (tanh approximation); the LM head is tied.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.distributed.pipeline import on_last_stage
from minivllm.layers.norm import GemmaRMSNorm
from minivllm.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, LlamaModel


class Gemma2DecoderLayer(torch.nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, layer_idx: int, **attn_opts: Any):
        super().__init__()
        layer_type = config.layer_types[layer_idx]
        if layer_type != "sliding_attention":
            attn_opts = {**attn_opts, "sliding_window": None}
        self.self_attn = LlamaAttention(config, backend, **self.layer_options(layer_type), **attn_opts)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_activation)
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    def layer_options(self, layer_type: str) -> dict[str, Any]:
        """Attention options that depend on the layer's type (Gemma 3 picks its RoPE base here)."""
        return {}

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden, meta))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class Gemma2Model(LlamaModel):
    layer_cls = Gemma2DecoderLayer

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, **attn_opts: Any) -> None:
        super().__init__(config, backend, **attn_opts)
        self.norm = on_last_stage(lambda: GemmaRMSNorm(config.hidden_size, config.rms_norm_eps))
        self.normalizer = config.hidden_size**0.5

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # (T, hidden)
        return hidden * torch.tensor(self.normalizer, dtype=hidden.dtype)


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else cap * torch.tanh(x / cap)


class Gemma2ForCausalLM(LlamaForCausalLM):
    model_cls = Gemma2Model

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError("use_bidirectional_attention=True (an encoder variant) is not supported; set it to false")
        super().__init__(config, backend)

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> dict[str, Any]:
        return {
            "qkv_bias": getattr(config, "attention_bias", False),
            "sliding_window": config.sliding_window,
            "scale": config.query_pre_attn_scalar**-0.5,
            "logits_soft_cap": config.attn_logit_softcapping,
        }

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, hidden) -> (N, vocab) fp32
        return soft_cap(self.lm_head.compute_logits(hidden), self.config.final_logit_softcapping)
