"""Qwen3: Llama with RMSNorm on each head of q and k (before RoPE) and an explicit
``head_dim`` that need not equal hidden_size / num_heads (0.6B: 1024 / 16 heads of 128)."""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from minivllm.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> dict[str, Any]:
        return {
            **super().attention_options(config),
            "qk_norm": True,
            "sliding_window": getattr(config, "sliding_window", None),
        }
