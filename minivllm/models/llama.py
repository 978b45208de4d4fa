"""Llama: pre-norm decoder with RMSNorm, RoPE, GQA attention and a SwiGLU MLP.

The attention and MLP blocks take the options that Llama's descendants need
(qkv bias, per-head q/k norm, sliding window), so those families are short
subclasses rather than copies.
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Callable, Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.distributed.pipeline import (
    IntermediateTensors,
    build_stage_layers,
    on_first_stage,
    on_last_stage,
    tied_head_weights,
)
from minivllm.layers.activation import ActAndMul
from minivllm.layers.attention import Attention
from minivllm.layers.embedding import VocabParallelEmbedding
from minivllm.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minivllm.layers.norm import RMSNorm
from minivllm.layers.rotary import get_rope
from minivllm.models.utils import load_weights, stage_lm_head


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        *,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        sliding_window: int | None = None,
        o_bias: bool | None = None,
        scale: float | None = None,
        logits_soft_cap: float | None = None,
        rope_layer_type: str | None = None,
        qk_norm_cls: type[RMSNorm] = RMSNorm,
        sinks: bool = False,
    ) -> None:
        """``o_bias`` defaults to ``qkv_bias`` (Llama's ``attention_bias`` covers both; Qwen2 biases q/k/v only).
        ``scale`` defaults to ``head_dim ** -0.5``; ``rope_layer_type`` picks a per-layer-type RoPE base (Gemma 3);
        ``sinks``: one learned attention-sink logit per head (gpt-oss), held by ``self.attn``."""
        super().__init__()
        hidden = config.hidden_size
        num_heads = config.num_attention_heads
        num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        head_dim = getattr(config, "head_dim", None) or hidden // num_heads
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, num_heads, num_kv_heads, bias=qkv_bias)
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden, bias=qkv_bias if o_bias is None else o_bias)
        self.rotary_emb = get_rope(config, head_dim, layer_type=rope_layer_type)
        self.head_dim = head_dim
        self.q_norm = qk_norm_cls(head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = qk_norm_cls(head_dim, config.rms_norm_eps) if qk_norm else None
        local_heads, local_kv = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        scale = head_dim**-0.5 if scale is None else scale
        self.attn = Attention(
            backend, local_heads, head_dim, local_kv, scale, sliding_window, logits_soft_cap, sinks=sinks
        )

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        T = hidden.shape[0]
        num_q, num_kv = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        qkv = self.qkv_proj(hidden).view(T, -1, self.head_dim)  # (T, heads + 2 * kv_heads, head_dim)
        v = qkv[:, num_q + num_kv :]
        q, k = qkv[:, :num_q], qkv[:, num_q : num_q + num_kv]
        if self.attn.prepare_qkv_(positions, q, k, v, self.rotary_emb, self.q_norm, self.k_norm, meta):
            return self.o_proj(self.attn(q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1), meta, kv_written=True))
        if self.q_norm is None:  # q and k side by side, rotated together
            q, k = self.rotary_emb.forward_qk(positions, qkv[:, : num_q + num_kv], num_q)
        else:
            q, k = self.q_norm(qkv[:, :num_q]), self.k_norm(qkv[:, num_q : num_q + num_kv])
            q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1), meta))


class LlamaMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate, intermediate], bias=bias)
        self.down_proj = RowParallelLinear(intermediate, hidden, bias=bias)
        self.act_fn = ActAndMul(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        layer_idx: int,
        mlp: nn.Module | None = None,
        **attn_opts: Any,
    ):
        """``mlp`` replaces the dense SwiGLU MLP (MoE families pass their sparse block)."""
        super().__init__()
        layer_types = getattr(config, "layer_types", None)  # Qwen2/3: sliding window only on some layers
        if layer_types is not None and layer_types[layer_idx] != "sliding_attention":
            attn_opts = {**attn_opts, "sliding_window": None}
        self.self_attn = LlamaAttention(config, backend, **attn_opts)
        if mlp is None:
            mlp = LlamaMLP(
                config.hidden_size, config.intermediate_size, config.hidden_act, getattr(config, "mlp_bias", False)
            )
        self.mlp = mlp
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


class LlamaModel(nn.Module):
    layer_cls = LlamaDecoderLayer
    cpu_decode: Callable | None = None
    """``device.cpu_fused_decode``: the whole stack for a decode-only step in one C call
    (``models/llama_cpu_decode.py``; it returns None for a step it does not serve)."""

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, **attn_opts: Any) -> None:
        super().__init__()
        self.embed_tokens = on_first_stage(lambda: VocabParallelEmbedding(config.vocab_size, config.hidden_size))
        self.layers, self.start, self.end = build_stage_layers(
            config.num_hidden_layers, lambda i: self.layer_cls(config, backend, i, **attn_opts)
        )  # this pipeline stage's layers; all of them when pp=1
        self.norm = on_last_stage(lambda: RMSNorm(config.hidden_size, config.rms_norm_eps))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # (T,) -> (T, hidden)
        """The token embeddings the first layer sees (Gemma and Granite scale them)."""
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        intermediate: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """Hidden states (T, hidden); a non-last pipeline stage returns its intermediate tensors instead.
        ``inputs_embeds`` (T, hidden) replaces the token embeddings (a multimodal model's merged inputs)."""
        if inputs_embeds is not None:
            hidden, residual = inputs_embeds, None
        elif intermediate is None:
            hidden, residual = self.embed(input_ids), None  # (T, hidden)
            if self.cpu_decode is not None and (done := self.cpu_decode(hidden, positions, meta)) is not None:
                hidden, _ = self.norm(*done)
                return hidden
        else:  # from the previous pipeline stage
            hidden, residual = intermediate["hidden"], intermediate["residual"]
        for layer in islice(self.layers, self.start, self.end):  # a slice would build a ModuleList per step
            hidden, residual = layer(positions, hidden, residual, meta)
        if self.end < len(self.layers):
            return {"hidden": hidden, "residual": residual}
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    model_cls = LlamaModel
    supports_pp = True
    pp_intermediate_keys = ("hidden", "residual")

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, **layer_opts: Any) -> None:
        """``layer_opts`` go to every decoder layer besides the attention options (e.g. ``expert_parallel``)."""
        super().__init__()
        self.config = config
        self.model = self.model_cls(config, backend, **self.attention_options(config), **layer_opts)
        tie = getattr(config, "tie_word_embeddings", False)
        self.lm_head = stage_lm_head(config.vocab_size, config.hidden_size, self.model.embed_tokens, tie)

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> dict[str, Any]:
        """Keyword options of every LlamaAttention; subclasses add theirs."""
        return {"qkv_bias": getattr(config, "attention_bias", False)}

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:  # (N,) -> (N, hidden)
        return self.model.embed(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        intermediate: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """``inputs_embeds`` (T, hidden): a multimodal model's merged inputs (``LlamaModel.forward``)."""
        return self.model(input_ids, positions, meta, intermediate, inputs_embeds)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, hidden) -> (N, vocab) fp32
        return self.lm_head.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        if getattr(self.config, "tie_word_embeddings", False):
            weights = tied_head_weights(weights, "model.embed_tokens.weight", self.lm_head, self.model.embed_tokens)
        load_weights(self, weights, self.packed_modules_mapping, ("rotary_emb.inv_freq",), resolve=self.resolve_weight)

    def resolve_weight(self, name: str) -> tuple[str, Any] | None:
        """(parameter, shard id) for checkpoint names ``packed_modules_mapping`` cannot express; None here."""
        return None
