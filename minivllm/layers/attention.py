"""The attention layer a model calls: reshape, then hand off to the backend.

The layer owns its slice of the paged KV cache (``kv_cache``), bound by the
model runner after the cache is allocated. Queries, keys and values arrive
already projected (and rotated) as flat ``(T, heads * head_dim)`` tensors.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.attention.kv_quant import is_fp8
from minivllm.distributed.parallel_state import tp_rank
from minivllm.layers.norm import RMSNorm
from minivllm.layers.ops import cpu_fused
from minivllm.layers.rotary import RotaryEmbedding
from minivllm.layers.weight_utils import copy_checked, narrow

FUSED_QKV_DEVICES = ("cuda",)
"""Where ``Attention.prepare_qkv_`` takes the fused Triton kernel (the CPU has its own C kernel)."""


class Attention(nn.Module):
    def __init__(
        self,
        backend: AttentionBackend,
        num_heads: int,
        head_dim: int,
        num_kv_heads: int,
        scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        sinks: bool = False,
    ) -> None:
        """``sinks``: the layer holds one learned sink logit per local head (gpt-oss's ``sinks``,
        loaded by ``weight_loader``: this rank's heads of the checkpoint's (total heads,) tensor),
        handed to the backend with every call; a backend whose ``forward`` takes no ``sinks`` is refused."""
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        self.backend = backend
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.scale = scale
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.kv_cache: torch.Tensor | None = None  # (2, num_blocks, block_size, num_kv_heads, head_dim)
        self.k_scale, self.v_scale = 1.0, 1.0  # fp8 KV cache: stored = k / k_scale (attention/kv_quant.py)
        self.fuse_qkv_prep = True
        """Whether ``prepare_qkv_`` may take the fused kernel (where it applies: CUDA with the Triton
        backend, the CPU with the torch backend)."""
        self.sinks: nn.Parameter | None = None  # (num_heads,) this rank's heads
        if sinks:
            if "sinks" not in inspect.signature(backend.forward).parameters:
                raise ValueError(
                    f"the attention backend {type(backend).__name__} takes no attention sinks, which this model "
                    "needs; use attention=torch or attention=triton"
                )
            self.sinks = nn.Parameter(torch.empty(num_heads), requires_grad=False)

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard: Any = None) -> None:
        """The checkpoint's (total heads,) sinks: this rank's ``num_heads`` of them."""
        copy_checked(param.data, narrow(loaded, 0, tp_rank() * self.num_heads, self.num_heads), "sinks")

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """This layer's slice of the paged cache: (2, num_blocks, block_size, num_kv_heads, head_dim)."""
        return (2, num_blocks, block_size, self.num_kv_heads, self.head_dim)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata, kv_written: bool = False
    ) -> torch.Tensor:
        """``kv_written``: ``prepare_qkv_`` already stored k and v in the cache (Triton and torch backends)."""
        if self.kv_cache is None:
            raise RuntimeError("the KV cache is not allocated: the model runner binds it in init_kv_cache()")
        T = q.shape[0]
        scales = {"k_scale": self.k_scale, "v_scale": self.v_scale} if is_fp8(self.kv_cache) else {}
        if self.sinks is not None:
            scales["sinks"] = self.sinks
        if kv_written:
            scales["kv_written"] = True
        out = self.backend.forward(
            q.view(T, self.num_heads, self.head_dim),
            k.view(T, self.num_kv_heads, self.head_dim),
            v.view(T, self.num_kv_heads, self.head_dim),
            self.kv_cache,
            meta,
            scale=self.scale,
            sliding_window=self.sliding_window,
            logits_soft_cap=self.logits_soft_cap,
            **scales,
        )
        return out.reshape(T, self.num_heads * self.head_dim)

    def prepare_qkv_(
        self,
        positions: torch.Tensor,  # (T,)
        q: torch.Tensor,  # (T, Hq, D)
        k: torch.Tensor,  # (T, Hkv, D)
        v: torch.Tensor,  # (T, Hkv, D)
        rotary: nn.Module,
        q_norm: nn.Module | None,
        k_norm: nn.Module | None,
        meta: AttentionMetadata,
    ) -> bool:
        """On CUDA with the Triton backend: the per-head q/k norms (where given), rotary and
        the KV-cache write in one kernel (``layers.ops.qk_norm_rope_kv``), ``q`` and ``k`` in
        place; then call ``forward`` with ``kv_written=True``. On the CPU with the torch backend:
        the per-head q/k norms (where given), rotary and the write of an fp32 cache in one C kernel
        (``_prepare_qkv_cpu``). Returns False, doing nothing,
        where that path does not apply (the CPU, another backend, an fp8 cache, a rotary
        embedding other than the plain one with its cos/sin table, a norm with other arithmetic,
        or ``fuse_qkv_prep`` off); the caller runs the torch layers then."""
        if self.fuse_qkv_prep and q.device.type == "cpu" and self.backend.name == "torch":
            return self._prepare_qkv_cpu(positions, q, k, v, rotary, q_norm, k_norm, meta)
        if not (self.fuse_qkv_prep and q.device.type in FUSED_QKV_DEVICES and self.backend.name == "triton"):
            return False
        cache = self.kv_cache
        if cache is None or cache.dtype != q.dtype or positions.dim() != 1:
            return False
        if type(rotary) is not RotaryEmbedding or rotary.cos_sin_cache is None:
            return False
        norms = q_norm is not None
        if norms and not (type(q_norm) is RMSNorm and type(k_norm) is RMSNorm and q_norm.eps == k_norm.eps):
            return False
        if norms and not all(n.weight.dtype == q.dtype and n.weight.shape[0] == q.shape[-1] for n in (q_norm, k_norm)):
            return False  # per-head norms in the model's dtype only
        from minivllm.layers.ops.qk_norm_rope_kv import qk_norm_rope_write_kv_

        qk_norm_rope_write_kv_(
            positions,
            q,
            k,
            v,
            rotary.cos_sin_cache,
            rotary.neox_style,
            cache,
            meta.slot_mapping,
            q_norm.weight if norms else None,
            k_norm.weight if norms else None,
            q_norm.eps if norms else 0.0,
        )
        return True

    def _prepare_qkv_cpu(self, positions, q, k, v, rotary, q_norm, k_norm, meta: AttentionMetadata) -> bool:
        """``prepare_qkv_`` on the CPU: ``cpu_fused.rope_write_kv_`` where it serves (the plain rotary
        embedding over whole heads from its cos/sin table, per-head q/k norms only as plain
        ``RMSNorm``s on the C kernel, fp32 everywhere, heads packed within each token's row); False
        otherwise."""
        cache = self.kv_cache
        if cache is None or type(rotary) is not RotaryEmbedding or not cpu_head_norms(q_norm, k_norm, q.shape[-1]):
            return False
        table = rotary.cos_sin_cache
        if table is None or rotary.rotary_dim != q.shape[-1] or positions.dim() != 1:
            return False
        slots = meta.slot_mapping
        if not (positions.dtype == slots.dtype == torch.int64 and len(positions) == len(slots) == len(q)):
            return False
        if not (q.dtype == cache.dtype == torch.float32 and cache.is_contiguous() and cpu_fused.load()):
            return False
        if not all(t.stride(-1) == 1 and t.stride(-2) == t.shape[-1] for t in (q, k, v)):
            return False
        if q_norm is None:
            cpu_fused.rope_write_kv_(positions, q, k, v, table, rotary.neox_style, cache, slots)
        else:
            weights = (q_norm.weight, k_norm.weight)
            cpu_fused.rope_write_kv_(positions, q, k, v, table, rotary.neox_style, cache, slots, *weights, q_norm.eps)
        return True


def cpu_head_norms(q_norm: nn.Module | None, k_norm: nn.Module | None, head_dim: int) -> bool:
    """Whether per-head q/k norms (or none) are ones the CPU's fused rotary kernel applies: both
    plain ``RMSNorm``s on the C kernel (``use_cpu_kernel``; GemmaRMSNorm's ``1 + w`` is not),
    with one eps and fp32 (head_dim,) weights."""
    if q_norm is None and k_norm is None:
        return True
    if not (type(q_norm) is RMSNorm and type(k_norm) is RMSNorm and q_norm.eps == k_norm.eps):
        return False
    return all(
        n.use_cpu_kernel and n.weight.dtype == torch.float32 and n.weight.shape == (head_dim,) for n in (q_norm, k_norm)
    )


def attention_layers(model: nn.Module) -> list[Attention]:
    """The model's attention layers in module order: the ones that hold a slice of the KV cache."""
    return [m for m in model.modules() if isinstance(m, Attention)]


def state_layers(model: nn.Module) -> list[nn.Module]:
    """The model's linear-attention layers in module order: the ones that keep fixed-size states
    per request (``state_shapes``, ``bind_states``: Qwen3-Next's Gated DeltaNet) instead of KV."""
    return [m for m in model.modules() if callable(getattr(m, "state_shapes", None))]


def uniform_sliding_window(model: nn.Module) -> int | None:
    """The widest window when every attention layer of ``model`` has one; None when any attends
    globally (or there is none). The worker reports it in its ``KVCacheSpec``."""
    windows = [m.sliding_window for m in attention_layers(model)]
    if not windows or any(w is None for w in windows):
        return None
    return max(windows)
