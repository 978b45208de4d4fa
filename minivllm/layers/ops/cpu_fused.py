"""The small per-token ops of a decoder layer on the CPU as three C kernels, one call each.

In eager torch on the CPU, an RMSNorm with its residual add is about ten aten calls, a SwiGLU
two, and the rotary embedding plus the KV-cache write six, each with its own dispatch, output
allocation and pass over memory; at the batch sizes of a CPU engine that overhead is a good part of
what is not GEMM. Here each is one pass over its rows:

- ``add_rms_norm_``: ``residual += x; x = rms_norm(residual) * weight`` in place (the fused
  add-and-norm between sublayers; without a residual, the norm into a new tensor);
- ``silu_and_mul``: ``[gate | up] -> silu(gate) * up``;
- ``rope_write_kv_``: q and k rotated in place from the shared cos/sin table
  (``RotaryEmbedding.cos_sin_cache``, NeoX or GPT-J pairs, the whole head), each head first
  RMS-normalised where the model has per-head q/k norms (Qwen3), then each token's k and v
  copied to its slot of an fp32 paged cache (negative slots skipped).

The arithmetic is the torch layers' in fp32 (sums of squares in another order, a vectorised
``expf``): results agree to fp32 rounding, not bit for bit. Rows are split over
``torch.get_num_threads()`` OpenMP threads, one per 32768 floats of work (torch's grain size), so a
small batch stays on the calling thread.
The library is built and cached like the paged decode kernel (``attention/cpu_paged_decode.py``,
``build_c_library``); where it cannot be, ``load()`` returns None and the layers keep their torch
code. fp32 contiguous rows on the CPU only; the callers check ``supports`` and fall back otherwise.
"""

from __future__ import annotations

import ctypes

import torch

from minivllm.c_kernels import CLibrary, profiled

_SOURCE = r"""
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

/* Threads for `work` floats: one per 32768 of them (torch's grain for elementwise ops), so small
   batches stay on the calling thread, where waking the others would cost more than they save. */
static int threads_for(int64_t work, int num_threads) {
    const int64_t n = work / 32768;
    return n < 1 ? 1 : (n < num_threads ? (int)n : num_threads);
}

/* r == 0: out = norm(x); else r += x, out = norm(r) (out may be x). All rows of n floats. */
void add_rms_norm_f32(float* x, int64_t xs, float* r, int64_t rs, float* out, int64_t os,
                      const float* w, int64_t T, int64_t n, float eps, int num_threads) {
    const int nt = threads_for(T * n, num_threads);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t t = 0; t < T; ++t) {
        float* xr = x + t * xs;
        float* src = xr;
        if (r) {
            float* rr = r + t * rs;
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) rr[i] += xr[i];
            src = rr;
        }
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < n; ++i) ss += src[i] * src[i];
        const float inv = 1.f / sqrtf(ss / (float)n + eps);
        float* o = out + t * os;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) o[i] = (src[i] * inv) * w[i];
    }
}

/* x: rows of [gate (n) | up (n)] at xs floats apart -> out rows of n: silu(gate) * up. */
void silu_and_mul_f32(const float* x, int64_t xs, float* out, int64_t os, int64_t T, int64_t n,
                      int num_threads) {
    const int nt = threads_for(T * n, num_threads);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t t = 0; t < T; ++t) {
        const float* g = x + t * xs;
        const float* u = g + n;
        float* o = out + t * os;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.f + expf(-g[i])) * u[i];
    }
}

static inline void rotate_head(float* h, const float* c, const float* s, int64_t D, int neox) {
    const int64_t half = D / 2;
    if (neox) {
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
            const float x1 = h[i], x2 = h[i + half];
            h[i] = x1 * c[i] - x2 * s[i];
            h[i + half] = x2 * c[i] + x1 * s[i];
        }
    } else {
        for (int64_t i = 0; i < half; ++i) {
            const float x1 = h[2 * i], x2 = h[2 * i + 1];
            h[2 * i] = x1 * c[i] - x2 * s[i];
            h[2 * i + 1] = x2 * c[i] + x1 * s[i];
        }
    }
}

/* One head's RMSNorm in place, with add_rms_norm_f32's arithmetic. */
static inline void norm_head(float* h, const float* w, int64_t D, float eps) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < D; ++i) ss += h[i] * h[i];
    const float inv = 1.f / sqrtf(ss / (float)D + eps);
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) h[i] = (h[i] * inv) * w[i];
}

/* q: T rows of Hq heads of D floats (heads packed, rows qs apart), k: Hk heads (rows ks apart),
   v like k (rows vs apart); cos_sin: (P, D) cosines then sines; positions, slots: (T,) int64.
   With q_norm and k_norm ((D,) weights, Qwen3's per-head norms), each head of q and k is first
   RMS-normalised (eps); then q and k are rotated in place; k_cache, v_cache (num_slots, Hk, D),
   when not null, get k and v at slots[t] (skipped where negative). */
void rope_write_kv_f32(float* q, int64_t qs, float* k, int64_t ks, const float* v, int64_t vs,
                       int64_t T, int64_t Hq, int64_t Hk, int64_t D, const int64_t* positions,
                       const float* cos_sin, int neox, float* k_cache, float* v_cache,
                       const int64_t* slots, const float* q_norm, const float* k_norm, float eps,
                       int num_threads) {
    const int nt = threads_for(T * (Hq + 2 * Hk) * D, num_threads);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t t = 0; t < T; ++t) {
        const float* c = cos_sin + positions[t] * D;
        const float* s = c + D / 2;
        for (int64_t h = 0; h < Hq; ++h) {
            float* qh = q + t * qs + h * D;
            if (q_norm) norm_head(qh, q_norm, D, eps);
            rotate_head(qh, c, s, D, neox);
        }
        float* kr = k + t * ks;
        for (int64_t h = 0; h < Hk; ++h) {
            if (k_norm) norm_head(kr + h * D, k_norm, D, eps);
            rotate_head(kr + h * D, c, s, D, neox);
        }
        if (k_cache && slots[t] >= 0) {
            memcpy(k_cache + slots[t] * Hk * D, kr, sizeof(float) * (size_t)(Hk * D));
            memcpy(v_cache + slots[t] * Hk * D, v + t * vs, sizeof(float) * (size_t)(Hk * D));
        }
    }
}
"""

i64, f32, ptr, nt = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int
LIBRARY = CLibrary(
    "cpu_fused",
    _SOURCE,
    "the CPU's norms, SwiGLU and rotary stay torch ops",
    {
        "add_rms_norm_f32": [ptr, i64, ptr, i64, ptr, i64, ptr, i64, i64, f32, nt],
        "silu_and_mul_f32": [ptr, i64, ptr, i64, i64, i64, nt],
        "rope_write_kv_f32": [ptr, i64, ptr, i64, ptr, i64]
        + [i64] * 4
        + [ptr, ptr, nt, ptr, ptr, ptr]
        + [ptr, ptr, f32, nt],
    },
)


def load() -> ctypes.CDLL | None:
    """The compiled library, built on first use; None where it cannot be (the layers' torch code runs)."""
    return LIBRARY.get()


def rows_ok(x: torch.Tensor) -> bool:
    """A 2-D fp32 CPU tensor whose rows are contiguous (rows may lie any distance apart)."""
    return x.dim() == 2 and x.dtype == torch.float32 and x.device.type == "cpu" and x.stride(1) == 1


def add_rms_norm_(
    x: torch.Tensor,  # (T, n) fp32 rows
    weight: torch.Tensor,  # (n,) fp32
    eps: float,
    residual: torch.Tensor | None = None,  # (T, n) fp32 rows
) -> torch.Tensor:
    """With ``residual``: ``residual += x``, then ``x`` = the norm of it (both in place), returns x;
    without: a new (T, n) tensor holding the norm of ``x``."""
    T, n = x.shape
    out = x if residual is not None else torch.empty((T, n), dtype=x.dtype)
    with profiled("cpu_fused_add_rms_norm"):
        LIBRARY.loaded.add_rms_norm_f32(  # type: ignore[union-attr]
            x.data_ptr(),
            x.stride(0),
            residual.data_ptr() if residual is not None else None,
            residual.stride(0) if residual is not None else 0,
            out.data_ptr(),
            out.stride(0),
            weight.data_ptr(),
            T,
            n,
            eps,
            torch.get_num_threads(),
        )
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # (T, 2n) fp32 rows -> (T, n)
    T, n = x.shape[0], x.shape[1] // 2
    out = torch.empty((T, n), dtype=x.dtype)
    with profiled("cpu_fused_silu_and_mul"):
        LIBRARY.loaded.silu_and_mul_f32(x.data_ptr(), x.stride(0), out.data_ptr(), n, T, n, torch.get_num_threads())  # type: ignore[union-attr]
    return out


def rope_write_kv_(
    positions: torch.Tensor,  # (T,) int64
    q: torch.Tensor,  # (T, Hq, D) fp32, heads packed
    k: torch.Tensor,  # (T, Hk, D) fp32, heads packed
    v: torch.Tensor,  # (T, Hk, D) fp32, heads packed
    cos_sin: torch.Tensor,  # (P, D) fp32 contiguous: cosines then sines
    neox_style: bool,
    kv_cache: torch.Tensor | None,  # (2, num_blocks, block_size, Hk, D) fp32 contiguous, or None
    slot_mapping: torch.Tensor | None,  # (T,) int64
    q_norm: torch.Tensor | None = None,  # (D,) fp32
    k_norm: torch.Tensor | None = None,  # (D,) fp32
    eps: float = 0.0,
) -> None:
    """Normalise each head of ``q`` and ``k`` (with ``q_norm`` and ``k_norm``: Qwen3's per-head
    RMSNorms, both or neither), rotate them, all in place; with a cache, store k and v at their slots."""
    T, Hq, D = q.shape
    Hk = k.shape[1]
    cache = kv_cache is not None
    with profiled("cpu_fused_rope_write_kv"):
        LIBRARY.loaded.rope_write_kv_f32(  # type: ignore[union-attr]
            q.data_ptr(),
            q.stride(0),
            k.data_ptr(),
            k.stride(0),
            v.data_ptr(),
            v.stride(0),
            T,
            Hq,
            Hk,
            D,
            positions.data_ptr(),
            cos_sin.data_ptr(),
            int(neox_style),
            kv_cache.data_ptr() if cache else None,  # keys: kv_cache[0]
            kv_cache.data_ptr() + kv_cache.stride(0) * kv_cache.element_size()
            if cache
            else None,  # values: kv_cache[1]
            slot_mapping.data_ptr() if cache else None,
            q_norm.data_ptr() if q_norm is not None else None,
            k_norm.data_ptr() if k_norm is not None else None,
            eps,
            torch.get_num_threads(),
        )
