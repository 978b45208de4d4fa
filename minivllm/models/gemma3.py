"""Gemma 3 (text): Gemma 2's layer with RMSNorm on each head of q and k, and
local/global layers that differ in their RoPE too.

``layer_types`` marks each layer ``sliding_attention`` (local: the sliding
window, RoPE base ``rope_parameters["sliding_attention"]``, 10k) or
``full_attention`` (global: no window, its own base of 1M, possibly scaled).
Attention scores are not soft-capped: transformers' Gemma 3 ignores
``attn_logit_softcapping``, and so does this model; final logits are capped
when ``final_logit_softcapping`` is set.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from minivllm.layers.norm import GemmaRMSNorm
from minivllm.models.gemma2 import Gemma2DecoderLayer, Gemma2ForCausalLM, Gemma2Model


class Gemma3DecoderLayer(Gemma2DecoderLayer):
    def layer_options(self, layer_type: str) -> dict[str, Any]:
        return {"rope_layer_type": layer_type, "qk_norm": True, "qk_norm_cls": GemmaRMSNorm}


class Gemma3Model(Gemma2Model):
    layer_cls = Gemma3DecoderLayer


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    model_cls = Gemma3Model

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> dict[str, Any]:
        return {**super().attention_options(config), "logits_soft_cap": None}
