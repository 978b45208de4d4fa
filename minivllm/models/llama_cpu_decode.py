"""Llama's decoder stack on the CPU in one C call for a decode-only step (``device.cpu_fused_decode``).

One decode step of a small model on the CPU is mostly weight streaming: at one request and one
thread the 768-hidden Llama of benchmarks/RESULTS.md spends ~10 ms of a ~12 ms step in its GEMMs,
at the machine's read bandwidth, and ~1.3 ms in Python: eleven module calls, four linear layers and
six C kernels per layer, each with its tensor bookkeeping. This module runs the same kernels in the
same order from C, one call per step for the whole stack: for each layer the residual add and
RMSNorm (``cpu_fused``), the QKV projection, rotary with the KV-cache write (``cpu_fused``),
attention over the paged cache (``cpu_paged_decode``), the output projection, the second add and
norm, gate/up, SiLU·mul (``cpu_fused``) and down. The driver holds no kernels of its own: it calls
the other libraries' functions through pointers, so the arithmetic is theirs, bit for bit.

It serves a step where every row is a request's single decode token (the torch backend's
``PagedDecode`` covers the batch), in a plain Llama stack: ``LlamaDecoderLayer`` of
``LlamaAttention`` (per-head q/k norms only as plain RMSNorms, as Qwen3's, applied by the rotary
kernel; full rotary from the cos/sin table, no window, soft cap or sinks)
and ``LlamaMLP`` (SiLU), plain ``RMSNorm``, unquantized fp32 linear layers (biases allowed) on one
tensor-parallel rank and one pipeline stage, an fp32 cache. One row runs the few-row GEMM on the
plain weights (``cpu_small_gemm``), more rows the panel GEMM on the packed ones (``cpu_panel_gemm``);
a step it does not serve, and any model it does not, runs the modules as before. The pointers are
read from the modules every step, so weight updates, sleep and a rebound cache reach it.
"""

from __future__ import annotations

import ctypes
import logging

import torch
from torch import nn

from minivllm.attention import cpu_paged_decode
from minivllm.attention.backend import AttentionMetadata
from minivllm.attention.torch_backend import PagedDecode
from minivllm.c_kernels import CLibrary, profiled
from minivllm.distributed.parallel_state import tp_size
from minivllm.layers.activation import ActAndMul
from minivllm.layers.attention import Attention, cpu_head_norms
from minivllm.layers.norm import RMSNorm
from minivllm.layers.ops import cpu_fused
from minivllm.layers.rotary import RotaryEmbedding
from minivllm.quantization import cpu_panel_gemm, cpu_small_gemm
from minivllm.quantization.base import UnquantizedLinearMethod
from minivllm.quantization.cpu_panel_gemm import PanelWeight

logger = logging.getLogger(__name__)

_SOURCE = r"""
#include <stdint.h>
#include <string.h>

typedef void (*gemm_fn)(const float*, int64_t, const float*, const float*, float*, int64_t, int64_t, int64_t,
                        int64_t, int);
typedef void (*norm_fn)(float*, int64_t, float*, int64_t, float*, int64_t, const float*, int64_t, int64_t, float,
                        int);
typedef void (*silu_fn)(const float*, int64_t, float*, int64_t, int64_t, int64_t, int);
typedef void (*rope_fn)(float*, int64_t, float*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                        int64_t, const int64_t*, const float*, int, float*, float*, const int64_t*, const float*,
                        const float*, float, int);
typedef void (*attn_fn)(const float*, const float*, const float*, float*, const int32_t*, int64_t,
                        const int32_t*, const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                        int64_t, float, int64_t, float, int);

/* The kernels, in this order in `fns`. */
enum { GEMM, NORM, SILU, ROPE, ATTN };
/* A layer's pointers, in this order in `layers` (biases and the per-head q/k norms may be null). */
enum { IN_NORM, POST_NORM, Q_NORM, K_NORM, QKV, QKV_B, O, O_B, GATE_UP, GATE_UP_B, DOWN, DOWN_B, K_CACHE, PER_LAYER };

/* hidden (T, H): the embedded tokens in, the last layer's MLP output out; residual (T, H): out, the
   stream the final norm adds it to; scratch: T * (H + (Hq + 2 Hk) D + Hq D + 3 I) floats. dims: H, Hq,
   Hk, D, I (intermediate); eps the layer norms', qk_eps the per-head q/k norms'. The attention rows of
   query b are b (a decode-only step); v's cache is kv_half floats past k's. */
void llama_decode_stack_f32(void* const* fns, void* const* layers, int64_t L, float* hidden, float* residual,
                            float* scratch, int64_t T, int64_t H, int64_t Hq, int64_t Hk, int64_t D, int64_t I, float eps,
                            float qk_eps, const int64_t* positions, const float* cos_sin, int neox, const int64_t* slots,
                            int64_t kv_half, const int32_t* block_tables, int64_t bt_stride,
                            const int32_t* seq_lens, const int64_t* rows, int64_t block_size, float scale,
                            int num_threads) {
    const gemm_fn gemm = (gemm_fn)fns[GEMM];
    const norm_fn norm = (norm_fn)fns[NORM];
    const silu_fn silu = (silu_fn)fns[SILU];
    const rope_fn rope = (rope_fn)fns[ROPE];
    const attn_fn attn = (attn_fn)fns[ATTN];
    const int64_t Q3 = (Hq + 2 * Hk) * D, Qd = Hq * D;
    float* xn = scratch;
    float* qkv = xn + T * H;
    float* att = qkv + T * Q3;
    float* gu = att + T * Qd;
    float* act = gu + T * 2 * I;
    for (int64_t l = 0; l < L; ++l) {
        void* const* w = layers + l * PER_LAYER;
        if (l == 0) {
            memcpy(residual, hidden, sizeof(float) * (size_t)(T * H));
            norm(hidden, H, NULL, 0, xn, H, (const float*)w[IN_NORM], T, H, eps, num_threads);
        } else {
            norm(hidden, H, residual, H, xn, H, (const float*)w[IN_NORM], T, H, eps, num_threads);
        }
        gemm(xn, H, (const float*)w[QKV], (const float*)w[QKV_B], qkv, Q3, T, Q3, H, num_threads);
        float* k_cache = (float*)w[K_CACHE];
        rope(qkv, Q3, qkv + Qd, Q3, qkv + Qd + Hk * D, Q3, T, Hq, Hk, D, positions, cos_sin, neox, k_cache,
             k_cache + kv_half, slots, (const float*)w[Q_NORM], (const float*)w[K_NORM], qk_eps, num_threads);
        attn(qkv, k_cache, k_cache + kv_half, att, block_tables, bt_stride, seq_lens, rows, T, Hq, Hk, D,
             block_size, Q3, Qd, scale, 0, 0.f, num_threads);
        gemm(att, Qd, (const float*)w[O], (const float*)w[O_B], hidden, H, T, H, Qd, num_threads);
        norm(hidden, H, residual, H, xn, H, (const float*)w[POST_NORM], T, H, eps, num_threads);
        gemm(xn, H, (const float*)w[GATE_UP], (const float*)w[GATE_UP_B], gu, 2 * I, T, 2 * I, H, num_threads);
        silu(gu, 2 * I, act, I, T, I, num_threads);
        gemm(act, I, (const float*)w[DOWN], (const float*)w[DOWN_B], hidden, H, T, H, I, num_threads);
    }
}
"""

i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
LIBRARY = CLibrary(
    "llama_decode",
    _SOURCE,
    "Llama's decode steps run module by module",
    {
        "llama_decode_stack_f32": (
            [ptr, ptr, i64, ptr, ptr, ptr]
            + [i64] * 6
            + [f32, f32, ptr, ptr, ctypes.c_int, ptr, i64, ptr, i64]
            + [ptr, ptr, i64, f32, ctypes.c_int]
        )  # fmt: skip
    },
    needs=(cpu_small_gemm.LIBRARY, cpu_fused.LIBRARY, cpu_paged_decode.LIBRARY),
)


def _why_not_layer(layer: nn.Module) -> str | None:
    """Why this decoder layer is not the plain Llama layer the C stack runs; None where it is."""
    from minivllm.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP

    if type(layer) is not LlamaDecoderLayer:
        return f"its decoder layers are {type(layer).__name__}, not LlamaDecoderLayer"
    attn, mlp = layer.self_attn, layer.mlp
    if type(attn) is not LlamaAttention or type(mlp) is not LlamaMLP:
        return f"its layers hold {type(attn).__name__} and {type(mlp).__name__}, not LlamaAttention and LlamaMLP"
    if not cpu_head_norms(attn.q_norm, attn.k_norm, attn.head_dim):
        return "its attention normalises q and k per head other than with plain RMSNorms on the CPU kernel"
    inner = attn.attn
    if type(inner) is not Attention or inner.backend.name != "torch" or not inner.fuse_qkv_prep:
        return "its attention does not run the torch backend's CPU kernels"
    if inner.sliding_window or inner.logits_soft_cap or inner.sinks is not None:
        return "its attention has a sliding window, a logit soft cap or sinks"
    rotary = attn.rotary_emb
    if type(rotary) is not RotaryEmbedding or rotary.rotary_dim != attn.head_dim:
        return "its rotary embedding is not the plain one over whole heads"
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if not all(type(n) is RMSNorm and n.use_cpu_kernel for n in norms):
        return "its norms are not the plain RMSNorm on the CPU kernel (torch.compile replaces them)"
    if type(mlp.act_fn) is not ActAndMul or not mlp.act_fn.use_cpu_kernel:
        return "its MLP activation is not SiLU on the CPU kernel"
    for linear in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
        if type(linear.quant_method) is not UnquantizedLinearMethod:
            return f"its linear layers are quantized ({type(linear.quant_method).__name__})"
        if linear.weight.dtype != torch.float32:
            return f"its weights are {linear.weight.dtype}, not float32"
    return None


def why_not(model: nn.Module) -> str | None:
    """Why ``model``'s decoder stack (a ``LlamaModel``) cannot run as one C call; None where it can."""
    layers = list(getattr(model, "layers", ()))
    if not layers:
        return "it has no decoder layers"
    if (model.start, model.end) != (0, len(layers)):
        return "it runs as pipeline stages"
    if tp_size() != 1:
        return "its layers are sharded over tensor-parallel ranks"
    if LIBRARY.get() is None:
        return "the C kernels are not built (no C compiler)"
    for layer in layers:
        why = _why_not_layer(layer)
        if why is not None:
            return why
    rotary = layers[0].self_attn.rotary_emb
    if any(
        (layer.self_attn.rotary_emb.cache_key(), layer.self_attn.rotary_emb.neox_style)
        != (rotary.cache_key(), rotary.neox_style)
        for layer in layers
    ):
        return "its layers rotate by different tables"
    if len({layer.self_attn.q_norm is None for layer in layers}) != 1:
        return "some of its layers normalise q and k per head and others do not"
    if len({_norm_eps(layer) for layer in layers}) != 1 or len(set(_norm_eps(layers[0])[:2])) != 1:
        return "its norms do not share one eps"
    return None


def _norm_eps(layer: nn.Module) -> tuple[float, ...]:
    """The eps of a layer's two norms and (where it has them) its per-head q/k norms."""
    attn = layer.self_attn
    heads = (attn.q_norm.eps, attn.k_norm.eps) if attn.q_norm is not None else ()
    return (layer.input_layernorm.eps, layer.post_attention_layernorm.eps, *heads)


class LlamaCpuDecode:
    """The decoder stack of a ``LlamaModel`` that ``why_not`` passes, as one C call per decode-only step."""

    def __init__(self, model: nn.Module) -> None:
        layers = list(model.layers)
        first = layers[0]
        attn, mlp = first.self_attn, first.mlp
        self.num_heads, self.num_kv_heads = attn.qkv_proj.num_heads, attn.qkv_proj.num_kv_heads
        self.head_dim = attn.head_dim
        self.intermediate = mlp.down_proj.weight.shape[1]
        self.eps = first.input_layernorm.eps
        self.qk_eps = attn.q_norm.eps if attn.q_norm is not None else 0.0
        self.scale = attn.attn.scale
        self.rotary = attn.rotary_emb
        self._entries = [
            (
                (
                    layer.input_layernorm.weight,
                    layer.post_attention_layernorm.weight,
                    *(n.weight if n is not None else None for n in (layer.self_attn.q_norm, layer.self_attn.k_norm)),
                ),
                [
                    (linear, linear.weight, linear.bias)
                    for linear in (
                        layer.self_attn.qkv_proj,
                        layer.self_attn.o_proj,
                        layer.mlp.gate_up_proj,
                        layer.mlp.down_proj,
                    )
                ],
                layer.self_attn.attn,
            )
            for layer in layers
        ]
        fused = cpu_fused.LIBRARY
        rest = [fused.address(name) for name in ("add_rms_norm_f32", "silu_and_mul_f32", "rope_write_kv_f32")]
        rest.append(cpu_paged_decode.LIBRARY.address("paged_decode_f32"))
        self._call = LIBRARY.get().llama_decode_stack_f32
        self._one_row = (ctypes.c_void_p * 5)(cpu_small_gemm.LIBRARY.address("small_gemm_f32"), *rest)
        panel = cpu_panel_gemm.LIBRARY
        self._rows = (ctypes.c_void_p * 5)(panel.address("panel_gemm_f32"), *rest) if panel.get() is not None else None

    def _pointers(self, panels: bool) -> ctypes.Array | None:
        """Each layer's norm weights, linear weights (plain, or packed panels) and biases, and KV cache,
        read now; None where a weight has no panels (``panels``) or the cache is not fp32. The
        parameters and modules were looked up once (``_entries``: ``nn.Module`` attribute lookups cost
        ~0.4 ms a step here); their data are read each call, so a weight moved, freed and brought back
        (sleep) or a rebound cache is seen."""
        ptrs: list[int | None] = []
        for norms, linears, attn in self._entries:
            cache = attn.kv_cache
            if cache is None or cache.dtype != torch.float32 or not cache.is_contiguous():
                return None
            ptrs += [n.data_ptr() if n is not None else None for n in norms]
            for linear, weight, bias in linears:
                if panels:
                    packed = linear.cpu_packed_weight
                    if not isinstance(packed, PanelWeight):
                        return None
                    ptrs.append(packed.panels.data_ptr())
                elif weight.is_contiguous():
                    ptrs.append(weight.data_ptr())
                else:
                    return None
                ptrs.append(bias.data_ptr() if bias is not None else None)
            ptrs.append(cache.data_ptr())
        return (ctypes.c_void_p * len(ptrs))(*ptrs)

    def __call__(
        self,
        hidden: torch.Tensor,  # (T, H) fp32: the embedded tokens
        positions: torch.Tensor,  # (T,) int64
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:  # (T, H) the last MLP's output, (T, H) the residual
        """The stack over a decode-only step, or None (nothing done) for a step it does not serve."""
        groups = meta.backend_data
        if not (groups and len(groups) == 1 and isinstance(groups[0], PagedDecode)):
            return None
        decode = groups[0]
        T = hidden.shape[0]
        slots = meta.slot_mapping
        if len(decode.rows) != T or positions.dim() != 1 or positions.dtype != torch.int64 or len(positions) != T:
            return None
        if slots.dtype != torch.int64 or len(slots) != T or hidden.dtype != torch.float32:
            return None
        fns = self._one_row if T == 1 else self._rows
        layers = self._pointers(panels=T > 1) if fns is not None else None
        if layers is None:
            return None
        table = self.rotary.cos_sin_cache
        if table is None:
            return None
        cache = self._entries[0][2].kv_cache
        hidden = hidden.contiguous()
        residual = torch.empty_like(hidden)
        H, D, Hq, Hk = hidden.shape[1], self.head_dim, self.num_heads, self.num_kv_heads
        scratch = torch.empty(T * (H + (2 * Hq + 2 * Hk) * D + 3 * self.intermediate), dtype=torch.float32)
        with profiled("cpu_llama_decode_stack"):
            self._call(
                fns,
                layers,
                len(self._entries),
                hidden.data_ptr(),
                residual.data_ptr(),
                scratch.data_ptr(),
                T,
                H,
                Hq,
                Hk,
                D,
                self.intermediate,
                self.eps,
                self.qk_eps,
                positions.data_ptr(),
                table.data_ptr(),
                int(self.rotary.neox_style),
                slots.data_ptr(),
                cache.stride(0),
                decode.block_tables.data_ptr(),
                decode.block_tables.stride(0),
                decode.seq_lens.data_ptr(),
                decode.rows.data_ptr(),
                cache.shape[2],
                self.scale,
                torch.get_num_threads(),
            )
        return hidden, residual


def attach(model: nn.Module, requested: bool | None) -> int:
    """Give every ``LlamaModel`` in ``model`` whose stack ``why_not`` passes its ``LlamaCpuDecode``
    (``device.cpu_fused_decode`` resolved on); returns how many. ``requested`` true (not null) where
    none qualifies is a ValueError naming why."""
    from minivllm.models.llama import LlamaModel

    stacks = [m for m in model.modules() if isinstance(m, LlamaModel)]
    reasons = [why_not(stack) for stack in stacks]
    for stack, why in zip(stacks, reasons):
        if why is None:
            stack.cpu_decode = LlamaCpuDecode(stack)
    attached = reasons.count(None)
    if requested and attached < max(len(stacks), 1):
        why = next((r for r in reasons if r is not None), "it has no Llama decoder stack")
        raise ValueError(f"device.cpu_fused_decode=true: {type(model).__name__} does not qualify: {why}; use null")
    if attached:
        logger.info("Decode steps run the decoder stack as one C call (device.cpu_fused_decode)")
    elif stacks:
        logger.info("Decode steps run the decoder layers one by one (device.cpu_fused_decode): %s", reasons[0])
    return attached
