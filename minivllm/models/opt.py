"""OPT: learned positions (offset by 2), LayerNorm, ReLU MLP, optional
embedding projection (word_embed_proj_dim != hidden_size) and post-norm variants."""

from __future__ import annotations

from itertools import islice
from typing import Any, Iterable

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
from minivllm.layers.activation import get_act_fn
from minivllm.layers.attention import Attention
from minivllm.layers.embedding import VocabParallelEmbedding
from minivllm.layers.linear import ColumnParallelLinear, QKVParallelLinear, ReplicatedLinear, RowParallelLinear
from minivllm.layers.norm import LayerNorm
from minivllm.models.utils import load_weights, stage_lm_head

POSITION_OFFSET = 2
"""OPT's learned position table reserves its first two rows."""


class OPTAttention(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        head_dim = hidden // heads
        bias = getattr(config, "enable_bias", True)
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, heads, heads, bias=bias)
        self.out_proj = RowParallelLinear(hidden, hidden, bias=bias)
        local = self.qkv_proj.num_heads
        self.attn = Attention(backend, local, head_dim, local, head_dim**-0.5)

    def forward(self, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).chunk(3, dim=-1)
        return self.out_proj(self.attn(q, k, v, meta))


class OPTDecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        hidden = config.hidden_size
        affine = getattr(config, "layer_norm_elementwise_affine", True)
        bias = getattr(config, "enable_bias", True)
        self.pre_norm = config.do_layer_norm_before
        self.self_attn = OPTAttention(config, backend)
        self.self_attn_layer_norm = LayerNorm(hidden, affine=affine, bias=affine)
        self.fc1 = ColumnParallelLinear(hidden, config.ffn_dim, bias=bias)
        self.fc2 = RowParallelLinear(config.ffn_dim, hidden, bias=bias)
        self.final_layer_norm = LayerNorm(hidden, affine=affine, bias=affine)
        self.act = get_act_fn(config.activation_function)

    def forward(self, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        hidden = self._sublayer(hidden, self.self_attn_layer_norm, lambda h: self.self_attn(h, meta))
        return self._sublayer(hidden, self.final_layer_norm, lambda h: self.fc2(self.act(self.fc1(h))))

    def _sublayer(self, x: torch.Tensor, norm: nn.Module, fn) -> torch.Tensor:
        if self.pre_norm:
            return x + fn(norm(x))
        return norm(x + fn(x))


class OPTDecoder(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        hidden, proj = config.hidden_size, config.word_embed_proj_dim
        num_positions = config.max_position_embeddings + POSITION_OFFSET
        self.embed_tokens = on_first_stage(lambda: VocabParallelEmbedding(config.vocab_size, proj))
        self.embed_positions = on_first_stage(lambda: VocabParallelEmbedding(num_positions, hidden))
        self.project_in = on_first_stage(lambda: ReplicatedLinear(proj, hidden, bias=False)) if proj != hidden else None
        self.project_out = on_last_stage(lambda: ReplicatedLinear(hidden, proj, bias=False)) if proj != hidden else None
        has_final_norm = config.do_layer_norm_before and not getattr(config, "_remove_final_layer_norm", False)
        affine = getattr(config, "layer_norm_elementwise_affine", True)
        self.final_layer_norm = (
            on_last_stage(lambda: LayerNorm(hidden, affine=affine, bias=affine)) if has_final_norm else None
        )
        self.layers, self.start, self.end = build_stage_layers(
            config.num_hidden_layers, lambda i: OPTDecoderLayer(config, backend)
        )  # this pipeline stage's layers; all of them when pp=1

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        intermediate: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """Hidden states (T, word_embed_proj_dim); a non-last pipeline stage returns its intermediate tensors."""
        if intermediate is None:
            hidden = self.embed_tokens(input_ids)  # (T, word_embed_proj_dim)
            if self.project_in is not None:
                hidden = self.project_in(hidden)
            hidden = hidden + self.embed_positions(positions + POSITION_OFFSET)  # (T, hidden)
        else:  # from the previous pipeline stage
            hidden = intermediate["hidden"]
        for layer in islice(self.layers, self.start, self.end):  # a slice would build a ModuleList per step
            hidden = layer(hidden, meta)
        if self.end < len(self.layers):
            return {"hidden": hidden}
        if self.final_layer_norm is not None:
            hidden = self.final_layer_norm(hidden)
        if self.project_out is not None:
            hidden = self.project_out(hidden)
        return hidden


class OPTModel(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.decoder = OPTDecoder(config, backend)


class OPTForCausalLM(nn.Module):
    packed_modules_mapping = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v")}
    supports_pp = True
    pp_intermediate_keys = ("hidden",)

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.model = OPTModel(config, backend)
        embedding = self.model.decoder.embed_tokens  # OPT always ties its head to it
        self.lm_head = stage_lm_head(config.vocab_size, config.word_embed_proj_dim, embedding, tie=True)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        intermediate: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        return self.model.decoder(input_ids, positions, meta, intermediate)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        renamed = ((n if n.startswith(("model.", "lm_head")) else f"model.{n}", w) for n, w in weights)
        embedding = "model.decoder.embed_tokens.weight"
        tied = tied_head_weights(renamed, embedding, self.lm_head, self.model.decoder.embed_tokens)
        load_weights(self, tied, self.packed_modules_mapping)
