"""GPT-NeoX (Pythia): LayerNorm blocks with a parallel residual
(``x + attn(ln1(x)) + mlp(ln2(x))``, or the usual serial one when
``use_parallel_residual`` is off), RoPE on only the first ``partial_rotary_factor``
of each head, and an untied output projection ``embed_out``.

The checkpoint's fused ``query_key_value`` is laid out head by head
(``[q0 k0 v0 | q1 k1 v1 | ...]``); ``load_weights`` regroups it to ``[q | k | v]``,
the layout ``QKVParallelLinear`` shards.
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
from minivllm.layers.rotary import get_rope
from minivllm.layers.weight_utils import as_tensor
from minivllm.models.utils import load_weights, stage_lm_head


class GPTNeoXAttention(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.head_dim = hidden // heads
        bias = getattr(config, "attention_bias", True)
        self.query_key_value = QKVParallelLinear(hidden, self.head_dim, heads, heads, bias=bias)
        self.dense = RowParallelLinear(hidden, hidden, bias=bias)
        self.rotary_emb = get_rope(config, self.head_dim)
        local = self.query_key_value.num_heads
        self.attn = Attention(backend, local, self.head_dim, local, self.head_dim**-0.5)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        T = hidden.shape[0]
        q, k, v = self.query_key_value(hidden).chunk(3, dim=-1)
        q, k = self.rotary_emb(positions, q.view(T, -1, self.head_dim), k.view(T, -1, self.head_dim))
        return self.dense(self.attn(q.reshape(T, -1), k.reshape(T, -1), v, meta))


class GPTNeoXMLP(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.dense_h_to_4h = ColumnParallelLinear(config.hidden_size, config.intermediate_size, bias=True)
        self.dense_4h_to_h = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=True)
        self.act = get_act_fn(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(self.act(self.dense_h_to_4h(x)))


class GPTNeoXLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.parallel_residual = config.use_parallel_residual
        self.input_layernorm = LayerNorm(hidden, eps=eps)
        self.post_attention_layernorm = LayerNorm(hidden, eps=eps)
        self.attention = GPTNeoXAttention(config, backend)
        self.mlp = GPTNeoXMLP(config)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        attn = self.attention(positions, self.input_layernorm(x), meta)
        if self.parallel_residual:
            return x + attn + self.mlp(self.post_attention_layernorm(x))
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class GPTNeoXModel(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.embed_in = on_first_stage(lambda: VocabParallelEmbedding(config.vocab_size, config.hidden_size))
        self.layers, self.start, self.end = build_stage_layers(
            config.num_hidden_layers, lambda i: GPTNeoXLayer(config, backend)
        )  # this pipeline stage's layers; all of them when pp=1
        self.final_layer_norm = on_last_stage(lambda: LayerNorm(config.hidden_size, eps=config.layer_norm_eps))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        intermediate: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        """Hidden states (T, hidden); a non-last pipeline stage returns its intermediate tensors instead."""
        hidden = self.embed_in(input_ids) if intermediate is None else intermediate["hidden"]  # (T, hidden)
        for layer in islice(self.layers, self.start, self.end):  # a slice would build a ModuleList per step
            hidden = layer(positions, hidden, meta)
        if self.end < len(self.layers):
            return {"hidden": hidden}
        return self.final_layer_norm(hidden)


class GPTNeoXForCausalLM(nn.Module):
    supports_pp = True
    pp_intermediate_keys = ("hidden",)

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.gpt_neox = GPTNeoXModel(config, backend)
        tie = getattr(config, "tie_word_embeddings", False)
        self.embed_out = stage_lm_head(config.vocab_size, config.hidden_size, self.gpt_neox.embed_in, tie)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        intermediate: IntermediateTensors | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        return self.gpt_neox(input_ids, positions, meta, intermediate)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (N, hidden) -> (N, vocab) fp32
        return self.embed_out.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        # Older checkpoints also hold causal-mask and rotary buffers.
        skip = (".attention.bias", ".attention.masked_bias", "rotary_emb.inv_freq")
        heads = self.config.num_attention_heads
        regrouped = ((n, _regroup_qkv(n, w, heads)) for n, w in weights)
        if getattr(self.config, "tie_word_embeddings", False):
            regrouped = tied_head_weights(
                regrouped,
                "gpt_neox.embed_in.weight",
                self.embed_out,
                self.gpt_neox.embed_in,
                head_name="embed_out.weight",
            )
        load_weights(self, regrouped, skip=skip)


def _regroup_qkv(name: str, weight: Any, num_heads: int) -> Any:
    """``[q0 k0 v0 | q1 k1 v1 | ...]`` rows -> ``[q0 q1 .. | k0 k1 .. | v0 v1 ..]``."""
    if ".query_key_value." not in name:
        return weight
    w = as_tensor(weight)
    rest = w.shape[1:]  # (hidden,) for the weight, () for the bias
    return w.view(num_heads, 3, -1, *rest).transpose(0, 1).reshape(w.shape)
