"""Mixtral: Mistral's attention with a sparse MoE block in place of every MLP.

Each token's router picks the top ``num_experts_per_tok`` of
``num_local_experts`` SwiGLU experts (of width ``intermediate_size``) and
renormalizes their softmax weights to sum to 1. The checkpoint keeps the block
under ``block_sparse_moe`` with experts' ``w1`` (gate), ``w3`` (up), ``w2`` (down).
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend
from minivllm.config.parallel import num_experts
from minivllm.layers.fused_moe import FusedMoE, SparseMoeBlock, expert_weight_target
from minivllm.models.llama import LlamaDecoderLayer, LlamaModel
from minivllm.models.mistral import MistralForCausalLM


class MixtralDecoderLayer(LlamaDecoderLayer):
    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        layer_idx: int,
        expert_parallel: bool = False,
        **attn_opts: Any,
    ) -> None:
        experts = FusedMoE(
            num_experts(config),
            config.num_experts_per_tok,
            config.hidden_size,
            config.intermediate_size,
            renormalize=True,
            expert_parallel=expert_parallel,
        )
        super().__init__(config, backend, layer_idx, mlp=SparseMoeBlock(config.hidden_size, experts), **attn_opts)


class MixtralModel(LlamaModel):
    layer_cls = MixtralDecoderLayer


class MixtralForCausalLM(MistralForCausalLM):
    model_cls = MixtralModel

    def resolve_weight(self, name: str) -> tuple[str, Any] | None:
        if ".block_sparse_moe." not in name:
            return None
        name = name.replace(".block_sparse_moe.", ".mlp.")  # our layers call every feed-forward block mlp
        return expert_weight_target(name) or (name, None)
