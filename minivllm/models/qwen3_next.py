"""Qwen3-Next: hybrid linear attention. Gated DeltaNet layers three to one with gated full
attention (``layer_types``, from ``full_attention_interval``), every layer a MoE with a gated
shared expert.

**Gated DeltaNet** (``linear_attention`` layers), per token::

    in_proj_qkvz -> per key head [q (Dk) | k (Dk) | v (r Dv) | z (r Dv)]      r = Hv / Hk
    in_proj_ba   -> per key head [b (r) | a (r)]          (both regrouped part by part at load)
    [q | k | v] -> causal depthwise conv (width K) -> SiLU                   conv state: last K - 1 inputs
    q, k L2-normalised, repeated r times (one per value head); beta = sigmoid(b);
    g = -exp(A_log) * softplus(a + dt_bias)                                  log decay
    o = gated delta rule (layers/ops/gated_delta_net.py)                     recurrent state (Hv, Dk, Dv)
    out_proj(RMSNorm(o) * SiLU(z))                                            per value head

The two states live in fixed-size slots, one per running request (``conv_state``,
``recurrent_state``: bound by the model runner, like an attention layer's ``kv_cache``); the
step's ``AttentionMetadata`` says which slot each request uses and whether it continues from
it (``state_indices``, ``has_initial_state``). A prefill runs the chunked form, a decode-only
step the recurrent one.

**Full attention**: ``q_proj`` gives per head [q | gate]; q and k get a (1 + w) RMSNorm per
head and rotary on the first ``partial_rotary_factor`` of each head; the output is multiplied by
``sigmoid(gate)`` before ``o_proj``. Every norm but the gated one scales by ``1 + weight``.

**MoE**: softmax top-k routed experts (renormalised with ``norm_topk_prob``) plus a shared
expert scaled by ``sigmoid(shared_expert_gate(x))``.

Tensor parallelism splits key/value heads (a rank keeps whole key-head groups, so the
interleaved projections split contiguously) and the conv channels of each of q, k and v.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.config.model import linear_attention_layers
from minivllm.distributed.parallel_state import tp_rank, tp_size
from minivllm.layers.attention import Attention
from minivllm.layers.fused_moe import FusedMoE, expert_weight_target
from minivllm.layers.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    copy_slice,
    divide,
)
from minivllm.layers.norm import GemmaRMSNorm
from minivllm.layers.ops import gated_delta_net, triton_gated_delta_net
from minivllm.layers.rotary import get_rope
from minivllm.layers.weight_utils import copy_checked, narrow
from minivllm.models.llama import LlamaForCausalLM, LlamaMLP, LlamaModel


def gated_delta_ops(device: torch.device):
    """The module of Gated DeltaNet's ops for ``device``: the Triton kernels on CUDA
    (``layers/ops/triton_gated_delta_net.py``), torch elsewhere; both take the same arguments."""
    return triton_gated_delta_net if device.type == "cuda" else gated_delta_net


def _l2norm(x: torch.Tensor) -> torch.Tensor:  # fp32, as the reference: x / sqrt(|x|^2 + 1e-6)
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class GatedRMSNorm(nn.Module):
    """RMSNorm(x) * weight, times SiLU(gate) in fp32, per value head."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # (N, D), (N, D) -> (N, D)
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (self.weight * normed * F.silu(gate.float())).to(x.dtype)


class ShortConv(nn.Module):
    """The depthwise conv's weight (local channels, K); the checkpoint's ``(C, 1, K)`` holds q, k
    and v channels back to back, and each rank takes its slice of each."""

    def __init__(self, sections: list[int], kernel: int) -> None:
        super().__init__()
        self.sections = sections  # full channel counts of q, k, v
        self.rank, self.size = tp_rank(), tp_size()
        local = sum(divide(s, self.size, "conv channels") for s in sections)
        self.weight = nn.Parameter(torch.empty(local, kernel), requires_grad=False)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        start, offset = 0, 0
        for full in self.sections:
            n = full // self.size
            part = narrow(loaded, 0, start + self.rank * n, n).reshape(n, -1)
            copy_checked(param.data.narrow(0, offset, n), part, "conv1d.weight")
            start, offset = start + full, offset + n


class GroupedColumnLinear(ColumnParallelLinear):
    """A column-parallel projection whose checkpoint rows come interleaved per key head
    (``[q | k | v | z]`` for each head, or ``[b | a]``): each rank takes its whole heads, and the
    loader regroups their rows part by part (all heads' q, then all k, ...), so that the
    forward pass splits the output into contiguous parts instead of gathering them every step."""

    def __init__(self, in_features: int, num_groups: int, part_sizes: list[int]) -> None:
        super().__init__(in_features, num_groups * sum(part_sizes), bias=False)
        local_groups = num_groups // self.tp_size
        width = sum(part_sizes)
        starts = [sum(part_sizes[:i]) for i in range(len(part_sizes))]
        self.order = [  # local output row -> row of this rank's slice as the checkpoint has it (a list: built on meta)
            g * width + start + i for start, n in zip(starts, part_sizes) for g in range(local_groups) for i in range(n)
        ]

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        n = param.shape[0]
        rows = narrow(loaded, 0, self.tp_rank * n, n)
        copy_checked(param.data, rows[torch.tensor(self.order, device=rows.device)], "grouped projection")


class Qwen3NextGatedDeltaNet(nn.Module):
    """A linear-attention layer with a conv state and a recurrent state per request (module docstring)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        world = tp_size()
        self.rank = tp_rank()
        hidden = config.hidden_size
        nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        self.num_k_heads = divide(nk, world, "linear_num_key_heads")
        self.num_v_heads = divide(nv, world, "linear_num_value_heads")
        self.ratio = nv // nk
        self.kernel = config.linear_conv_kernel_dim
        key_dim, value_dim = nk * self.dk, nv * self.dv
        # loaded regrouped: outputs [q (all heads) | k | v | z] and [b | a] (GroupedColumnLinear)
        self.in_proj_qkvz = GroupedColumnLinear(
            hidden, nk, [self.dk, self.dk, self.ratio * self.dv, self.ratio * self.dv]
        )
        self.in_proj_ba = GroupedColumnLinear(hidden, nk, [self.ratio, self.ratio])
        self.conv1d = ShortConv([key_dim, key_dim, value_dim], self.kernel)
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads), requires_grad=False)
        self.dt_bias = nn.Parameter(torch.empty(self.num_v_heads), requires_grad=False)
        self.norm = GatedRMSNorm(self.dv, config.rms_norm_eps)
        self.out_proj = RowParallelLinear(value_dim, hidden, bias=False)
        self.conv_state: torch.Tensor | None = None  # (slots, conv channels, K - 1), the model's dtype
        self.recurrent_state: torch.Tensor | None = None  # (slots, Hv, Dk, Dv) fp32

    def state_shapes(self, num_slots: int, dtype: torch.dtype) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of the conv state and the recurrent state for ``num_slots`` requests."""
        channels = self.conv1d.weight.shape[0]
        return [
            ((num_slots, channels, self.kernel - 1), dtype),
            ((num_slots, self.num_v_heads, self.dk, self.dv), torch.float32),
        ]

    def bind_states(self, conv: torch.Tensor | None, recurrent: torch.Tensor | None) -> None:
        self.conv_state, self.recurrent_state = conv, recurrent

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        """``A_log`` and ``dt_bias``: this rank's value heads."""
        n = param.shape[0]
        copy_slice(param.data, loaded, 0, self.rank * n, n)

    def forward(self, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        if self.recurrent_state is None:
            raise RuntimeError("the linear-attention states are not allocated: the model runner binds them")
        T = hidden.shape[0]
        nk, nv, dk, dv, r = self.num_k_heads, self.num_v_heads, self.dk, self.dv, self.ratio
        mixed, z = self.in_proj_qkvz(hidden).split([2 * nk * dk + nv * dv, nv * dv], dim=-1)  # [q | k | v], z
        b, a = self.in_proj_ba(hidden).split([nv, nv], dim=-1)  # (T, Hv) each
        slots = dict(
            state_indices=meta.state_indices, cu_seqlens=meta.query_start_loc, has_initial_state=meta.has_initial_state
        )
        ops = gated_delta_ops(hidden.device)
        mixed = ops.causal_conv1d(mixed, self.conv1d.weight, None, conv_states=self.conv_state, **slots)
        q, k, v = mixed.split([nk * dk, nk * dk, nv * dv], dim=-1)
        q = _l2norm(q.reshape(T, nk, dk)).repeat_interleave(r, dim=1)  # (T, Hv, Dk) fp32
        k = _l2norm(k.reshape(T, nk, dk)).repeat_interleave(r, dim=1)  # (T, Hv, Dk) fp32
        v = v.reshape(T, nv, dv)  # (T, Hv, Dv)
        beta = b.sigmoid().float()  # (T, Hv)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())  # (T, Hv)
        rule = ops.recurrent_gated_delta_rule if meta.max_query_len == 1 else ops.chunk_gated_delta_rule
        o = rule(q, k, v, g, beta, scale=dk**-0.5, states=self.recurrent_state, **slots)  # (T, Hv, Dv)
        o = self.norm(o.reshape(T * nv, dv), z.reshape(T * nv, dv)).view(T, nv * dv)
        return self.out_proj(o)


class Qwen3NextAttention(nn.Module):
    """Gated full attention: q_proj gives [q | gate] per head; (1 + w) q/k norms; partial rotary."""

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend) -> None:
        super().__init__()
        hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // heads
        bias = bool(getattr(config, "attention_bias", False))
        # [q | gate] per head: two head_dim-wide "heads" each, so ranks split whole heads
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, 2 * heads, kv_heads, bias=bias)
        self.o_proj = RowParallelLinear(heads * self.head_dim, hidden, bias=bias)
        self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.rotary_emb = get_rope(config, self.head_dim)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads // 2, self.qkv_proj.num_kv_heads
        self.attn = Attention(backend, self.num_heads, self.head_dim, self.num_kv_heads, self.head_dim**-0.5)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        T, H, D, Hk = hidden.shape[0], self.num_heads, self.head_dim, self.num_kv_heads
        qkv = self.qkv_proj(hidden)
        qg, k, v = qkv.split([2 * H * D, Hk * D, Hk * D], dim=-1)
        q, gate = qg.view(T, H, 2 * D).split([D, D], dim=-1)  # (T, H, D) each
        q, k = self.q_norm(q.contiguous()), self.k_norm(k.reshape(T, Hk, D).contiguous())
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q.reshape(T, H * D), k.reshape(T, Hk * D), v.contiguous(), meta)  # (T, H * D)
        return self.o_proj(out * torch.sigmoid(gate.reshape(T, H * D)))


class Qwen3NextSparseMoeBlock(nn.Module):
    """Routed experts plus a shared expert gated per token by a sigmoid."""

    def __init__(self, config: PretrainedConfig, expert_parallel: bool = False) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(config.hidden_size, config.num_experts, bias=False)
        self.experts = FusedMoE(
            config.num_experts,
            config.num_experts_per_tok,
            config.hidden_size,
            config.moe_intermediate_size,
            renormalize=bool(getattr(config, "norm_topk_prob", False)),
            expert_parallel=expert_parallel,
        )
        self.shared_expert = LlamaMLP(config.hidden_size, config.shared_expert_intermediate_size, config.hidden_act)
        self.shared_expert_gate = ReplicatedLinear(config.hidden_size, 1, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (T, hidden) -> (T, hidden)
        routed = self.experts(hidden, self.gate(hidden))
        return routed + torch.sigmoid(self.shared_expert_gate(hidden)) * self.shared_expert(hidden)


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(
        self, config: PretrainedConfig, backend: AttentionBackend, layer_idx: int, expert_parallel: bool = False
    ) -> None:
        super().__init__()
        self.is_linear = layer_idx in linear_attention_layers(config)
        if self.is_linear:
            self.linear_attn = Qwen3NextGatedDeltaNet(config)
        else:
            self.self_attn = Qwen3NextAttention(config, backend)
        only_mlp = getattr(config, "mlp_only_layers", None) or []
        step = getattr(config, "decoder_sparse_step", 1) or 1
        if config.num_experts > 0 and layer_idx not in only_mlp and (layer_idx + 1) % step == 0:
            self.mlp: nn.Module = Qwen3NextSparseMoeBlock(config, expert_parallel)
        else:
            self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.linear_attn(hidden, meta) if self.is_linear else self.self_attn(positions, hidden, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class Qwen3NextModel(LlamaModel):
    layer_cls = Qwen3NextDecoderLayer

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, **layer_opts: Any) -> None:
        super().__init__(config, backend, **layer_opts)
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)


class Qwen3NextForCausalLM(LlamaForCausalLM):
    """Qwen3-Next (module docstring). One pipeline stage only: its states are per layer and per request."""

    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    model_cls = Qwen3NextModel
    supports_pp = False

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> dict[str, Any]:
        return {}

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Skips the multi-token-prediction head (``mtp.*``) released checkpoints carry."""
        super().load_weights((name, w) for name, w in weights if not name.startswith("mtp."))

    def resolve_weight(self, name: str) -> tuple[str, Any] | None:
        if name.endswith("shared_expert_gate.weight"):  # not a gate_proj of the packed mapping
            return name, None
        return expert_weight_target(name)
