"""gpt-oss: Llama-shaped attention with learned sinks, and an MoE of biased, clamped-SwiGLU experts.

- Attention: q/k/v/o biases, GQA, YaRN RoPE (rotate-half), and per head a learned sink
  logit (``self_attn.sinks``) that joins the softmax's denominator and adds no value; the
  attention backends apply it (``AttentionBackend.forward(sinks=...)``). Layers alternate
  sliding-window and full attention by ``layer_types``.
- MoE on every layer: a router with a bias (``mlp.router``) takes the top-k logits and a
  softmax over those k (the same as renormalizing the top-k of a full softmax); each expert
  computes ``down(act(gate_up(x) + b13)) + b2`` with the clamped SwiGLU
  ``(clamp(up, -l, l) + 1) * g * sigmoid(alpha * g)``, ``g = min(gate, l)``.

Checkpoint layout of the experts (all experts in one tensor each)::

    mlp.experts.gate_up_proj       (E, H, 2I)  gate and up interleaved in the columns (gate at even)
    mlp.experts.gate_up_proj_bias  (E, 2I)     interleaved likewise
    mlp.experts.down_proj          (E, I, H)
    mlp.experts.down_proj_bias     (E, H)

or, in gpt-oss's released MXFP4 checkpoints, ``gate_up_proj_blocks`` / ``gate_up_proj_scales``
(and ``down_proj_*``) in (out, in) layout, dequantized while loading (``quantization/mxfp4.py``).
Both are stored here as ``w13`` (E, 2I_local, H) = [gate; up] rows and ``w2`` (E, H, I_local),
each expert's intermediate dim sliced over the tensor-parallel ranks as a dense MLP's is.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend
from minivllm.distributed.parallel_state import all_reduce, tp_rank, tp_size
from minivllm.layers.activation import clamped_swiglu
from minivllm.layers.fused_moe import route
from minivllm.layers.linear import ReplicatedLinear, divide
from minivllm.layers.weight_utils import as_tensor, copy_checked
from minivllm.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from minivllm.quantization.mxfp4 import dequantize_mxfp4


class GptOssExperts(nn.Module):
    """Every expert of one layer, with biases; ``forward(hidden, router_logits)`` routes and combines.

    Each rank holds every expert's slice of the intermediate dim and a partial sum over the same
    tokens; the down-projection bias is added on rank 0 only, so the all-reduce adds it once.
    On CUDA the Triton fused-MoE kernel runs them (``triton_fused_experts`` with the biases
    and the clamped SwiGLU); elsewhere torch: for each expert that received tokens, gather them,
    run its MLP, scale by the routing weight and add into their outputs.
    """

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.num_experts, self.top_k = config.num_local_experts, config.num_experts_per_tok
        self.alpha, self.limit = float(config.swiglu_alpha), float(config.swiglu_limit)
        E, H = self.num_experts, config.hidden_size
        self.intermediate = config.intermediate_size
        I = self.local_intermediate = divide(config.intermediate_size, self.tp_size, "intermediate_size")
        self.w13 = nn.Parameter(torch.empty(E, 2 * I, H), requires_grad=False)
        self.b13 = nn.Parameter(torch.empty(E, 2 * I), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(E, H, I), requires_grad=False)
        self.b2 = nn.Parameter(torch.empty(E, H), requires_grad=False)
        self._mxfp4_parts: dict[str, dict[str, torch.Tensor]] = {}  # blocks or scales waiting for the other

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard: str) -> None:
        """``shard``: the checkpoint tensor's suffix (``gate_up_proj``, ``down_proj_bias``, ``down_proj_blocks`` ...)."""
        if shard.endswith(("_blocks", "_scales")):  # MXFP4: dequantize once both halves are in
            proj, _, part = shard.rpartition("_")
            parts = self._mxfp4_parts.setdefault(proj, {})
            parts[part] = as_tensor(loaded)
            if len(parts) < 2:
                return
            del self._mxfp4_parts[proj]
            device = param.device
            out_in = dequantize_mxfp4(parts["blocks"].to(device), parts["scales"].to(device), torch.float32)
            shard, loaded = proj, out_in.transpose(1, 2)  # the checkpoint's unquantized (in, out) layout
        loaded = as_tensor(loaded)
        I, start = self.local_intermediate, self.tp_rank * self.local_intermediate
        if shard == "gate_up_proj":  # (E, H, 2I) interleaved -> [gate; up] rows of this rank
            gate, up = loaded[..., 0::2], loaded[..., 1::2]  # (E, H, I) each
            value = torch.cat([gate[..., start : start + I], up[..., start : start + I]], dim=-1).transpose(1, 2)
        elif shard == "gate_up_proj_bias":  # (E, 2I) interleaved
            gate, up = loaded[..., 0::2], loaded[..., 1::2]
            value = torch.cat([gate[..., start : start + I], up[..., start : start + I]], dim=-1)
        elif shard == "down_proj":  # (E, I, H) -> (E, H, I_local)
            value = loaded[:, start : start + I].transpose(1, 2)
        elif shard == "down_proj_bias":  # (E, H), added once over the ranks
            value = loaded if self.tp_rank == 0 else torch.zeros_like(loaded)
        else:
            raise ValueError(f"gpt-oss experts: unexpected checkpoint tensor {shard!r}")
        copy_checked(param.data, value, f"experts.{shard}")

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """hidden (T, H), router_logits (T, E) -> (T, H), summed over the tensor-parallel group."""
        weights, ids = route(router_logits, self.top_k, renormalize=True)  # (T, k) each
        if hidden.is_cuda:
            from minivllm.layers.fused_moe.triton_experts import triton_fused_experts

            out = triton_fused_experts(
                hidden, self.w13, self.w2, weights, ids, b13=self.b13, b2=self.b2, swiglu=(self.alpha, self.limit)
            )
        else:
            out = self.torch_experts(hidden, weights, ids)
        return all_reduce(out) if self.tp_size > 1 else out

    def torch_experts(self, hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The loop over the experts that received tokens: hidden (T, H), weights and ids (T, k) -> (T, H)."""
        k = ids.shape[1]
        flat = ids.flatten()  # (T*k,) pair t*k+s -> expert
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        flat_weights = weights.flatten()
        out = torch.zeros_like(hidden)
        start = 0
        for expert, n in enumerate(counts):
            if n == 0:
                continue
            pairs = order[start : start + n]
            start += n
            tokens = pairs // k
            act = clamped_swiglu(F.linear(hidden[tokens], self.w13[expert], self.b13[expert]), self.alpha, self.limit)
            y = F.linear(act, self.w2[expert], self.b2[expert])  # (n, H)
            out.index_add_(0, tokens, (y * flat_weights[pairs, None]).to(out.dtype))
        return out


class GptOssMoE(nn.Module):
    """``router`` (a replicated linear with a bias) then the experts; names follow the checkpoint."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.router = ReplicatedLinear(config.hidden_size, config.num_local_experts, bias=True)
        self.experts = GptOssExperts(config)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H)
        return self.experts(hidden, self.router(hidden))


class GptOssDecoderLayer(LlamaDecoderLayer):
    def __init__(
        self,
        config: PretrainedConfig,
        backend: AttentionBackend,
        layer_idx: int,
        expert_parallel: bool = False,
        **attn_opts: Any,
    ) -> None:
        if expert_parallel:
            raise ValueError(
                "parallel.enable_expert_parallel: gpt-oss's experts are split over the tensor-parallel "
                "ranks only; set it to false"
            )
        super().__init__(config, backend, layer_idx, mlp=GptOssMoE(config), **attn_opts)


class GptOssModel(LlamaModel):
    layer_cls = GptOssDecoderLayer


class GptOssForCausalLM(LlamaForCausalLM):
    model_cls = GptOssModel

    @classmethod
    def attention_options(cls, config: PretrainedConfig) -> dict[str, Any]:
        return {
            "qkv_bias": getattr(config, "attention_bias", True),
            "sliding_window": config.sliding_window,
            "sinks": True,
        }

    def resolve_weight(self, name: str) -> tuple[str, Any] | None:
        if name.endswith(".self_attn.sinks"):
            return name.replace(".self_attn.sinks", ".self_attn.attn.sinks"), None
        prefix, sep, leaf = name.rpartition(".mlp.experts.")
        if not sep:
            return None
        proj = leaf.removesuffix("_blocks").removesuffix("_scales")
        param = {"gate_up_proj": "w13", "gate_up_proj_bias": "b13", "down_proj": "w2", "down_proj_bias": "b2"}
        if proj not in param:
            return None
        return f"{prefix}.mlp.experts.{param[proj]}", leaf
