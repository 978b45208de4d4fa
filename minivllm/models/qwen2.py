"""Qwen2 / Qwen2.5: Llama with biases on the q, k and v projections (not on o).

Sliding-window attention, when ``use_sliding_window`` is on, applies only to the
layers that ``config.layer_types`` marks ``sliding_attention`` (LlamaDecoderLayer
reads that list).
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from minivllm.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> dict[str, Any]:
        return {"qkv_bias": True, "o_bias": False, "sliding_window": getattr(config, "sliding_window", None)}
