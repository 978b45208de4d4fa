"""Mistral: Llama with sliding-window attention on every layer.

A query at position p attends to keys ``p - sliding_window + 1 .. p``
(``config.sliding_window`` tokens, itself included); null means full attention
(Mistral-7B v0.2 onwards).
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from minivllm.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> dict[str, Any]:
        return {**super().attention_options(config), "sliding_window": getattr(config, "sliding_window", None)}
