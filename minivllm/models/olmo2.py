"""OLMo 2: a Llama-shaped decoder whose norms come after each sublayer, and whose
q/k RMSNorms span the whole projection (all heads at once, not head by head).

    stream = stream + post_attention_layernorm(attention(stream))
    stream = stream + post_feedforward_layernorm(mlp(stream))

No norm precedes a sublayer; the final norm does. Under tensor parallelism each
rank holds some heads, so the q/k norms sum their squares over the ranks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.distributed.parallel_state import all_reduce, tp_rank, tp_size
from minivllm.layers.norm import RMSNorm
from minivllm.layers.weight_utils import copy_checked, narrow
from minivllm.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, LlamaModel


class ShardedRMSNorm(RMSNorm):
    """RMSNorm over a feature dimension split across tensor-parallel ranks:
    this rank holds ``local_size`` features (and their weights) starting at
    ``shard * local_size``. Replicated shards (KV heads on more ranks than heads)
    count once per replica in both the sum and the size, so the mean is exact."""

    def __init__(self, local_size: int, eps: float, shard: int) -> None:
        super().__init__(local_size, eps)
        self.local_size, self.shard, self.tp_size = local_size, shard, tp_size()

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        copy_checked(param.data, narrow(loaded, 0, self.shard * self.local_size, self.local_size), "qk norm")

    def _norm(self, x: torch.Tensor) -> torch.Tensor:  # (T, local_size)
        x32 = x.float()
        sum_sq = all_reduce(x32.pow(2).sum(-1, keepdim=True))  # (T, 1) over every rank's features
        x32 = x32 * torch.rsqrt(sum_sq / (self.local_size * self.tp_size) + self.eps)
        return (self.weight.float() * x32).to(x.dtype)


class Olmo2Attention(LlamaAttention):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__(config, backend, qkv_bias=getattr(config, "attention_bias", False))
        proj, eps = self.qkv_proj, config.rms_norm_eps
        self.q_norm = ShardedRMSNorm(proj.q_size, eps, tp_rank())
        self.k_norm = ShardedRMSNorm(proj.kv_size, eps, tp_rank() // proj.kv_replicas)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        T = hidden.shape[0]
        sizes = [self.qkv_proj.q_size, self.qkv_proj.kv_size, self.qkv_proj.kv_size]
        q, k, v = self.qkv_proj(hidden).split(sizes, dim=-1)
        q, k = self.q_norm(q), self.k_norm(k)  # (T, heads * head_dim), (T, kv_heads * head_dim)
        q, k = self.rotary_emb(positions, q.view(T, -1, self.head_dim), k.view(T, -1, self.head_dim))
        return self.o_proj(self.attn(q.reshape(T, -1), k.reshape(T, -1), v, meta))


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, layer_idx: int, **attn_opts: Any):
        super().__init__()
        self.self_attn = Olmo2Attention(config, backend)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (the MLP's normed output, the stream before it); the next layer adds them."""
        stream = hidden if residual is None else hidden + residual
        stream = stream + self.post_attention_layernorm(self.self_attn(positions, stream, meta))
        return self.post_feedforward_layernorm(self.mlp(stream)), stream


class Olmo2Model(LlamaModel):
    layer_cls = Olmo2DecoderLayer


class Olmo2ForCausalLM(LlamaForCausalLM):
    model_cls = Olmo2Model
