"""DeepSeek V2 and V3: Multi-head Latent Attention and a routed MoE with shared experts.

Attention (``layers/mla.py``, ``attention/mla.py``): queries come from ``q_proj``
(V2-Lite: ``q_lora_rank`` unset) or through a low-rank ``q_a_proj`` -> RMSNorm ->
``q_b_proj`` (V2, V3); keys and values from one latent per token,
``kv_a_proj_with_mqa`` -> [c (kv_lora_rank) ; k_pe (qk_rope_head_dim)], c normalized,
k_pe rotated and shared by all heads. The cache holds that latent, nothing per head.
Rope rotates even/odd pairs (V2 always; V3 unless ``rope_interleave`` is off). With
DeepSeek's yarn the softmax scale is ``qk_head_dim ** -0.5 * mscale(factor, mscale_all_dim) ** 2``.

Feed-forward: the first ``first_k_dense_replace`` layers keep a dense SwiGLU MLP
(``intermediate_size``); the rest route each token to ``num_experts_per_tok`` of
``n_routed_experts`` experts (``moe_intermediate_size``) and add ``n_shared_experts``
always-on experts (one SwiGLU MLP that wide). Routers, on fp32 logits:

* V2 (``topk_method="greedy"``): softmax, top-k; ``group_limited_greedy``: top-k within
  the ``topk_group`` groups (of ``n_group``) with the largest best score;
* V3 (``noaux_tc``): sigmoid; experts chosen by score + ``e_score_correction_bias``
  within the ``topk_group`` groups whose two best biased scores sum highest; weights
  are the unbiased scores, renormalized when ``norm_topk_prob``.

Either way the weights are multiplied by ``routed_scaling_factor``.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.config.model import rope_parameters
from minivllm.distributed.parallel_state import all_reduce, tp_size
from minivllm.layers.fused_moe import FusedMoE, expert_weight_target, fused_experts
from minivllm.layers.fused_moe.layer import to_local_ids
from minivllm.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear, divide
from minivllm.layers.mla import MLAAttention
from minivllm.layers.norm import RMSNorm
from minivllm.layers.rotary import get_rope
from minivllm.models.llama import LlamaForCausalLM, LlamaMLP, LlamaModel


def mla_softmax_scale(config: PretrainedConfig) -> float:
    """``qk_head_dim ** -0.5``, times DeepSeek's yarn ``mscale(factor, mscale_all_dim) ** 2`` when set."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    params = rope_parameters(config)
    mscale_all_dim = params.get("mscale_all_dim") or 0
    if params["rope_type"] != "default" and mscale_all_dim:
        factor = params["factor"]
        mscale = 1.0 if factor <= 1 else 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


class DeepseekV2Attention(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.r, self.dn, self.dr = config.kv_lora_rank, config.qk_nope_head_dim, config.qk_rope_head_dim
        self.dv = config.v_head_dim
        qk_head_dim = self.dn + self.dr
        bias = bool(getattr(config, "attention_bias", False))
        self.q_lora_rank = getattr(config, "q_lora_rank", None)
        if self.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(hidden, heads * qk_head_dim, bias=False)
        else:
            self.q_a_proj = ReplicatedLinear(hidden, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, 1e-6)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, heads * qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden, self.r + self.dr, bias=bias)  # the latent: every rank
        self.kv_a_layernorm = RMSNorm(self.r, 1e-6)
        self.kv_b_proj = ColumnParallelLinear(self.r, heads * (self.dn + self.dv), bias=False)  # heads split
        self.o_proj = RowParallelLinear(heads * self.dv, hidden, bias=bias)
        interleaved = config.model_type == "deepseek_v2" or getattr(config, "rope_interleave", True)
        self.rotary_emb = get_rope(config, self.dr, rotary_dim=self.dr, neox_style=not interleaved)
        self.num_heads = divide(heads, tp_size(), "num_attention_heads")
        self.attn = MLAAttention(backend, self.num_heads, self.r, self.dn, self.dr, self.dv, mla_softmax_scale(config))

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        T = hidden.shape[0]
        if self.q_lora_rank is None:
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q = q.view(T, self.num_heads, self.dn + self.dr)  # (T, H, dn + dr)
        q_nope, q_pe = q[..., : self.dn], q[..., self.dn :].contiguous()
        kv = self.kv_a_proj_with_mqa(hidden)  # (T, r + dr)
        c = self.kv_a_layernorm(kv[:, : self.r].contiguous())  # (T, r)
        k_pe = kv[:, self.r :].contiguous().view(T, 1, self.dr)  # (T, 1, dr)
        q_pe, k_pe = self.rotary_emb(positions, q_pe, k_pe)
        latent = torch.cat((c, k_pe.view(T, self.dr)), dim=-1)  # (T, r + dr)
        out = self.attn.forward_latent(q_nope, q_pe, latent, self.kv_b_proj.weight, meta)  # (T, H * dv)
        return self.o_proj(out)


class DeepseekRouter(nn.Module):
    """The gate of one MoE layer: fp32 logits over the routed experts -> (weights, expert ids)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.num_experts, self.top_k = config.n_routed_experts, config.num_experts_per_tok
        # V3 always routes by biased sigmoid scores in groups (its checkpoints say "noaux_tc"); V2 by topk_method.
        self.method = "noaux_tc" if config.model_type == "deepseek_v3" else getattr(config, "topk_method", "greedy")
        if self.method not in ("greedy", "group_limited_greedy", "noaux_tc"):
            raise ValueError(f"topk_method={self.method!r}: supported are greedy, group_limited_greedy, noaux_tc")
        self.n_group, self.topk_group = getattr(config, "n_group", None), getattr(config, "topk_group", None)
        self.norm_topk_prob = bool(getattr(config, "norm_topk_prob", False))
        self.routed_scaling_factor = float(getattr(config, "routed_scaling_factor", 1.0))
        self.weight = nn.Parameter(torch.empty(self.num_experts, config.hidden_size), requires_grad=False)
        if self.method == "noaux_tc":
            # A buffer, as in transformers: a routing offset, not a weight (loaded by the model's load_weights).
            self.register_buffer("e_score_correction_bias", torch.zeros(self.num_experts, dtype=torch.float32))

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden (T, hidden) -> weights (T, k) fp32, ids (T, k) int64."""
        logits = F.linear(hidden.float(), self.weight.float())  # (T, E)
        if self.method == "noaux_tc":
            scores = logits.sigmoid()
            choice = self._within_groups(scores + self.e_score_correction_bias.float(), 2, float("-inf"))
            ids = choice.topk(self.top_k, dim=-1, sorted=False)[1]
            weights = scores.gather(1, ids)
            if self.norm_topk_prob:
                weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        else:
            scores = logits.softmax(dim=-1)
            if self.method == "group_limited_greedy":
                scores = self._within_groups(scores, 1, 0.0)
            weights, ids = scores.topk(self.top_k, dim=-1, sorted=False)
        return weights * self.routed_scaling_factor, ids

    def _within_groups(self, scores: torch.Tensor, best: int, fill: float) -> torch.Tensor:
        """scores (T, E) with the experts outside the ``topk_group`` best groups set to ``fill``;
        a group's rank is the sum of its ``best`` highest scores."""
        T = scores.shape[0]
        grouped = scores.view(T, self.n_group, -1)  # (T, groups, E / groups)
        group_scores = grouped.topk(best, dim=-1)[0].sum(dim=-1)  # (T, groups)
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, group_scores.topk(self.topk_group, dim=-1, sorted=False)[1], True)
        return grouped.masked_fill(~keep.unsqueeze(-1), fill).view(T, -1)


class DeepseekV2MoE(nn.Module):
    """Routed experts (``FusedMoE``'s stacked weights, sharded like any MoE) plus the shared experts."""

    def __init__(self, config: PretrainedConfig, expert_parallel: bool = False) -> None:
        super().__init__()
        self.gate = DeepseekRouter(config)
        self.experts = FusedMoE(
            config.n_routed_experts,
            config.num_experts_per_tok,
            config.hidden_size,
            config.moe_intermediate_size,
            renormalize=False,  # the router weighs
            expert_parallel=expert_parallel,
        )
        shared = getattr(config, "n_shared_experts", None) or 0
        self.shared_experts = (
            LlamaMLP(config.hidden_size, config.moe_intermediate_size * shared, config.hidden_act) if shared else None
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H)
        weights, ids = self.gate(hidden)  # (T, k) each
        moe = self.experts
        if moe.expert_parallel:
            ids = to_local_ids(ids, moe.first_expert, moe.num_local_experts)
        out = fused_experts(hidden, moe.w13, moe.w2, weights.to(hidden.dtype), ids)
        if moe.tp_size > 1:
            out = all_reduce(out)
        return out if self.shared_experts is None else out + self.shared_experts(hidden)


class DeepseekV2DecoderLayer(nn.Module):
    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, layer_idx: int, expert_parallel: bool = False
    ) -> None:
        super().__init__()
        self.self_attn = DeepseekV2Attention(config, backend)
        if layer_idx >= config.first_k_dense_replace and config.n_routed_experts:
            self.mlp: nn.Module = DeepseekV2MoE(config, expert_parallel)
        else:
            self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class DeepseekV2Model(LlamaModel):
    layer_cls = DeepseekV2DecoderLayer


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    """DeepSeek V2 / V2-Lite (and V3 below): Llama's embedding, stages and head around MLA decoder layers."""

    packed_modules_mapping = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
    model_cls = DeepseekV2Model

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> dict[str, Any]:
        return {}

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Skips the multi-token-prediction layers V3 checkpoints append (``model.layers.{num_hidden_layers}``...)."""
        first_mtp = f"model.layers.{self.config.num_hidden_layers}."
        super().load_weights(self._take_router_biases(w for w in weights if not w[0].startswith(first_mtp)))

    def _take_router_biases(self, weights: Iterable[tuple[str, Any]]) -> Iterable[tuple[str, Any]]:
        """Copy V3's ``e_score_correction_bias`` tensors into their buffers; pass the rest on."""
        buffers = dict(self.named_buffers())
        for name, tensor in weights:
            if not name.endswith(".e_score_correction_bias"):
                yield name, tensor
            elif name in buffers:  # absent: a layer another pipeline stage holds
                loaded = tensor if isinstance(tensor, torch.Tensor) else tensor[...]
                buffers[name].copy_(loaded.to(buffers[name].dtype))

    def resolve_weight(self, name: str) -> tuple[str, Any] | None:
        return expert_weight_target(name)


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek V3 (and R1): V2's layers with the sigmoid, bias-corrected grouped router."""
