"""Qwen3-MoE: Qwen3's attention (per-head q/k RMSNorm) with sparse MoE blocks.

A layer is sparse unless listed in ``mlp_only_layers`` or skipped by
``decoder_sparse_step`` (layer i is sparse when ``(i + 1) % step == 0``); the
others keep a dense SwiGLU MLP of ``intermediate_size``. Experts have width
``moe_intermediate_size``; the top-k softmax weights are renormalized only when
``norm_topk_prob`` is set. Checkpoint experts: ``mlp.experts.{e}.gate_proj/up_proj/down_proj``.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend
from minivllm.config.parallel import num_experts
from minivllm.layers.fused_moe import FusedMoE, SparseMoeBlock, expert_weight_target
from minivllm.models.llama import LlamaDecoderLayer, LlamaModel
from minivllm.models.qwen3 import Qwen3ForCausalLM


def is_sparse_layer(config: PretrainedConfig, layer_idx: int) -> bool:
    step = getattr(config, "decoder_sparse_step", 1) or 1
    only_mlp = getattr(config, "mlp_only_layers", None) or []
    return num_experts(config) > 0 and layer_idx not in only_mlp and (layer_idx + 1) % step == 0


class Qwen3MoeDecoderLayer(LlamaDecoderLayer):
    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        layer_idx: int,
        expert_parallel: bool = False,
        **attn_opts: Any,
    ) -> None:
        mlp: nn.Module | None = None  # dense layers keep Llama's MLP
        if is_sparse_layer(config, layer_idx):
            experts = FusedMoE(
                num_experts(config),
                config.num_experts_per_tok,
                config.hidden_size,
                config.moe_intermediate_size,
                renormalize=bool(getattr(config, "norm_topk_prob", False)),
                expert_parallel=expert_parallel,
            )
            mlp = SparseMoeBlock(config.hidden_size, experts)
        super().__init__(config, backend, layer_idx, mlp=mlp, **attn_opts)


class Qwen3MoeModel(LlamaModel):
    layer_cls = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    model_cls = Qwen3MoeModel

    def resolve_weight(self, name: str) -> tuple[str, Any] | None:
        return expert_weight_target(name)
