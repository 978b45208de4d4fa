"""Phi-3: Llama whose checkpoint already stores the fused ``qkv_proj`` and
``gate_up_proj`` tensors, with an optional sliding window on every layer and an
optional partial rotary factor (``get_rope`` reads it from the config).

The fused layers take a checkpoint tensor with ``shard_id=None`` and split it
into its members themselves, so nothing is renamed: the mapping is empty.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from minivllm.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    packed_modules_mapping: dict[str, tuple[str, Any]] = {}

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> dict[str, Any]:
        return {"qkv_bias": False, "sliding_window": getattr(config, "sliding_window", None)}
