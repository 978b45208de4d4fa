"""GPT-2: learned absolute positions, pre-norm LayerNorm blocks, a GELU MLP, and
an LM head tied to the token embedding.

Its checkpoints store every projection as a ``Conv1D`` weight of shape
(in, out), the transpose of a linear layer's; ``load_weights`` wraps those
tensors in ``Transposed`` so the shared layers load (and shard) them unchanged.
``c_attn`` is a fused q|k|v projection, which ``QKVParallelLinear`` splits.
"""

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
from minivllm.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minivllm.layers.norm import LayerNorm
from minivllm.layers.weight_utils import Transposed
from minivllm.models.utils import load_weights, stage_lm_head

CONV1D_MODULES = ("c_attn", "c_proj", "c_fc")
"""GPT-2 modules whose checkpoint weights are stored (in, out)."""


class GPT2Attention(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, layer_idx: int) -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        head_dim = hidden // heads
        scale = head_dim**-0.5 if getattr(config, "scale_attn_weights", True) else 1.0
        if getattr(config, "scale_attn_by_inverse_layer_idx", False):
            scale /= layer_idx + 1
        self.c_attn = QKVParallelLinear(hidden, head_dim, heads, heads, bias=True)
        self.c_proj = RowParallelLinear(hidden, hidden, bias=True)
        local = self.c_attn.num_heads
        self.attn = Attention(backend, local, head_dim, local, scale)

    def forward(self, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.c_attn(hidden).chunk(3, dim=-1)
        return self.c_proj(self.attn(q, k, v, meta))


class GPT2MLP(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        inner = getattr(config, "n_inner", None) or 4 * hidden
        self.c_fc = ColumnParallelLinear(hidden, inner, bias=True)
        self.c_proj = RowParallelLinear(inner, hidden, bias=True)
        self.act = get_act_fn(config.activation_function)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, layer_idx: int) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_epsilon
        self.ln_1 = LayerNorm(hidden, eps=eps)
        self.attn = GPT2Attention(config, backend, layer_idx)
        self.ln_2 = LayerNorm(hidden, eps=eps)
        self.mlp = GPT2MLP(config)

    def forward(self, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        hidden = hidden + self.attn(self.ln_1(hidden), meta)
        return hidden + self.mlp(self.ln_2(hidden))


class GPT2Model(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        hidden, num_positions = config.hidden_size, config.max_position_embeddings
        self.wte = on_first_stage(lambda: VocabParallelEmbedding(config.vocab_size, hidden))
        self.wpe = on_first_stage(lambda: VocabParallelEmbedding(num_positions, hidden))
        self.h, self.start, self.end = build_stage_layers(
            config.num_hidden_layers, lambda i: GPT2Block(config, backend, i)
        )  # this pipeline stage's blocks; all of them when pp=1
        self.ln_f = on_last_stage(lambda: LayerNorm(hidden, eps=config.layer_norm_epsilon))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        intermediate: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """Hidden states (T, hidden); a non-last pipeline stage returns its intermediate tensors instead."""
        if intermediate is None:
            hidden = self.wte(input_ids) + self.wpe(positions)  # (T, hidden)
        else:  # from the previous pipeline stage
            hidden = intermediate["hidden"]
        for block in islice(self.h, self.start, self.end):  # a slice would build a ModuleList per step
            hidden = block(hidden, meta)
        if self.end < len(self.h):
            return {"hidden": hidden}
        return self.ln_f(hidden)


class GPT2LMHeadModel(nn.Module):
    supports_pp = True
    pp_intermediate_keys = ("hidden",)

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.transformer = GPT2Model(config, backend)
        tie = getattr(config, "tie_word_embeddings", True)
        self.lm_head = stage_lm_head(config.vocab_size, config.hidden_size, self.transformer.wte, tie)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        intermediate: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        return self.transformer(input_ids, positions, meta, intermediate)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, hidden) -> (N, vocab) fp32
        return self.lm_head.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        # ".attn.bias"/".attn.masked_bias" are causal-mask buffers saved by older checkpoints.
        skip = (".attn.bias", ".attn.masked_bias")
        renamed = (_rename(n, w) for n, w in weights)
        if getattr(self.config, "tie_word_embeddings", True):
            renamed = tied_head_weights(renamed, "transformer.wte.weight", self.lm_head, self.transformer.wte)
        load_weights(self, renamed, skip=skip)


def _rename(name: str, weight: Any) -> tuple[str, Any]:
    """Hub checkpoints (``h.0.attn...``) lack the ``transformer.`` prefix that transformers writes."""
    if not name.startswith(("transformer.", "lm_head")):
        name = f"transformer.{name}"
    module, _, kind = name.rpartition(".")
    if kind == "weight" and module.rpartition(".")[2] in CONV1D_MODULES:
        weight = Transposed(weight)
    return name, weight
