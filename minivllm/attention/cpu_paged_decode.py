"""Decode attention on the CPU that reads the paged KV cache in place: a small C kernel.

The torch backend's decode path copies every request's blocks into a dense tensor
(one ``index_select`` per layer) before SDPA reads them again. This kernel walks
each request's block table instead and reads each cache slot once, where it lies
in the cache: per request, block by block, an online softmax (a running max and sum
per query head, rescaled when a block raises the max) in fp32. Within a block it goes
slot by slot: a slot's ``Hkv * D`` floats are contiguous, and each K or V row is
loaded once for the ``H / Hkv`` query heads that share it (GQA). The next block of
the table lies elsewhere in memory, where the hardware prefetcher cannot guess it:
the kernel prefetches it a slot at a time while computing the current one (the
reads come from memory, so this was worth 1.5x; head_dim 64 and 128 are compile-time
constants so their loops are whole vectors; a request's last block fetches the first
block of the request its thread likely takes next; benchmarks/RESULTS.md,
``benchmarks/cpu_paged_decode.py``). Work is split over the requests with OpenMP, in the same
runtime torch uses (the kernel links ``libgomp.so.1``, which the loader resolves
to the copy torch already loaded), with ``torch.get_num_threads()`` threads.

Built and cached like the CPU's other C kernels (``minivllm/c_kernels.py``); where it cannot
be, ``load()`` returns None once and the backend keeps its block-gather path: same results,
more copying. fp32 caches and
queries only (bf16 and fp8 caches take the gather path).
"""

from __future__ import annotations

import ctypes

import torch

from minivllm.c_kernels import CLibrary

_SOURCE = r"""
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

/* One request: an online softmax over its cache blocks. Per block: the scores of its m slots for
   every query head (slot-major: a slot's Hkv * D floats are contiguous and each K row is loaded once
   for the G query heads that share it), the running max and sum of each query head rescaled, then
   the values added the same way. D is a constant at the call sites for 64 and 128, so the head_dim
   loops unroll into whole vectors. s: (H, block_size) scores; acc: (H, D); mx, l: (H,). */
static inline __attribute__((always_inline)) void decode_request(
    const float* restrict qb, const float* restrict k_cache, const float* restrict v_cache,
    float* restrict ob, const int32_t* restrict table, int64_t start, int64_t n, int64_t H,
    int64_t Hkv, const int64_t D, int64_t block_size, float scale, float soft_cap, float* restrict s,
    float* restrict acc, float* restrict mx, float* restrict l, int64_t after) {
    const int64_t G = H / Hkv, row = Hkv * D;
    for (int64_t hq = 0; hq < H; ++hq) {
        mx[hq] = -FLT_MAX;
        l[hq] = 0.f;
        for (int64_t d = 0; d < D; ++d) acc[hq * D + d] = 0.f;
    }
    for (int64_t p = start; p < n;) {
        const int64_t blk = p / block_size, off = p % block_size;
        const int64_t m = (n - p < block_size - off) ? n - p : block_size - off;
        const int64_t base = ((int64_t)table[blk] * block_size + off) * row;
        const float* kb = k_cache + base;
        const float* vb = v_cache + base;
        /* the next block lies elsewhere: fetch it a slot at a time while this one computes */
        const float* nk = 0;
        const float* nv = 0;
        int64_t nm = 0;
        if (p + m < n) {
            const int64_t nb = (int64_t)table[blk + 1] * block_size * row;
            nk = k_cache + nb;
            nv = v_cache + nb;
            nm = (n - p - m < block_size) ? n - p - m : block_size;
        } else if (after >= 0) { /* the last block: fetch the first block of the request likely next */
            nk = k_cache + after * block_size * row;
            nv = v_cache + after * block_size * row;
            nm = block_size;
        }
        for (int64_t j = 0; j < m; ++j) {
            for (int64_t i = 0; j < nm && i < row; i += 16) __builtin_prefetch(nk + j * row + i);
            for (int64_t h = 0; h < Hkv; ++h) {
                const float* kr = kb + j * row + h * D;
                for (int64_t g = 0; g < G; ++g) {
                    const float* qh = qb + (h * G + g) * D;
                    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                    for (int64_t d = 0; d < D; ++d) dot += qh[d] * kr[d];
                    s[(h * G + g) * block_size + j] = dot * scale;
                }
            }
        }
        for (int64_t hq = 0; hq < H; ++hq) {
            float* sh = s + hq * block_size;
            if (soft_cap > 0.f)
                for (int64_t j = 0; j < m; ++j) sh[j] = soft_cap * tanhf(sh[j] / soft_cap);
            float bm = mx[hq];
            for (int64_t j = 0; j < m; ++j) bm = sh[j] > bm ? sh[j] : bm;
            const float corr = expf(mx[hq] - bm); /* 0 on the first block: mx was -FLT_MAX */
            float sum = 0.f;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < m; ++j) {
                sh[j] = expf(sh[j] - bm);
                sum += sh[j];
            }
            l[hq] = l[hq] * corr + sum;
            mx[hq] = bm;
            if (corr != 1.f)
                for (int64_t d = 0; d < D; ++d) acc[hq * D + d] *= corr;
        }
        for (int64_t j = 0; j < m; ++j) {
            for (int64_t i = 0; j < nm && i < row; i += 16) __builtin_prefetch(nv + j * row + i);
            for (int64_t h = 0; h < Hkv; ++h) {
                const float* vr = vb + j * row + h * D;
                for (int64_t g = 0; g < G; ++g) {
                    const float w = s[(h * G + g) * block_size + j];
                    float* ah = acc + (h * G + g) * D;
#pragma omp simd
                    for (int64_t d = 0; d < D; ++d) ah[d] += w * vr[d];
                }
            }
        }
        p += m;
    }
    for (int64_t hq = 0; hq < H; ++hq) {
        const float inv = 1.f / l[hq];
        for (int64_t d = 0; d < D; ++d) ob[hq * D + d] = acc[hq * D + d] * inv;
    }
}

/* q: rows of (H, D) at q_stride floats apart; k_cache, v_cache: (num_blocks, bs, Hkv, D);
   out: rows like q; block_tables: (B, bt_stride) int32; seq_lens: (B,) int32; rows: (B,) int64
   token row of each request's query. window <= 0: none; soft_cap <= 0: none. */
void paged_decode_f32(const float* q, const float* k_cache, const float* v_cache, float* out,
                      const int32_t* block_tables, int64_t bt_stride, const int32_t* seq_lens,
                      const int64_t* rows, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                      int64_t block_size, int64_t q_stride, int64_t out_stride, float scale,
                      int64_t window, float soft_cap, int num_threads) {
    const int nt = B < 1 ? 1 : (B < num_threads ? (int)B : num_threads); /* a thread a request at most */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float* s = (float*)malloc(sizeof(float) * (size_t)(H * block_size + H * D + 2 * H));
        float* acc = s + H * block_size;
        float* mx = acc + H * D;
        float* l = mx + H;
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < B; ++b) {
            const int64_t n = seq_lens[b];
            const int64_t start = (window > 0 && n > window) ? n - window : 0;
            const float* qb = q + rows[b] * q_stride;
            float* ob = out + rows[b] * out_stride;
            const int32_t* table = block_tables + b * bt_stride;
            int64_t after = -1; /* the first block this thread likely reads next (requests go round) */
            const int64_t nx = b + omp_get_num_threads();
            if (nx < B) {
                const int64_t nn = seq_lens[nx], ns = (window > 0 && nn > window) ? nn - window : 0;
                after = block_tables[nx * bt_stride + ns / block_size];
            }
            if (D == 64)
                decode_request(qb, k_cache, v_cache, ob, table, start, n, H, Hkv, 64, block_size, scale,
                               soft_cap, s, acc, mx, l, after);
            else if (D == 128)
                decode_request(qb, k_cache, v_cache, ob, table, start, n, H, Hkv, 128, block_size, scale,
                               soft_cap, s, acc, mx, l, after);
            else
                decode_request(qb, k_cache, v_cache, ob, table, start, n, H, Hkv, D, block_size, scale,
                               soft_cap, s, acc, mx, l, after);
        }
        free(s);
    }
}
"""

i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
LIBRARY = CLibrary(
    "paged_decode",
    _SOURCE,
    "CPU decode attention gathers blocks instead of reading them in place",
    {"paged_decode_f32": [ptr] * 5 + [i64, ptr, ptr] + [i64] * 7 + [f32, i64, f32, ctypes.c_int]},
)


def load() -> ctypes.CDLL | None:
    """The compiled kernel library, built on first use; None where it cannot be (see module doc)."""
    return LIBRARY.get()


def supports(query: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the kernel serves these tensors: fp32 on the CPU, cache contiguous, heads packed."""
    return (
        query.device.type == "cpu"
        and query.dtype == torch.float32
        and kv_cache.dtype == torch.float32
        and kv_cache.is_contiguous()
        and query.stride(-1) == 1
        and query.stride(-2) == query.shape[-1]
    )


def paged_decode(
    lib: ctypes.CDLL,
    query: torch.Tensor,  # (T, H, D) fp32
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hkv, D) fp32
    out: torch.Tensor,  # (T, H, D) fp32, rows ``rows`` written
    block_tables: torch.Tensor,  # (B, W) int32 contiguous
    seq_lens: torch.Tensor,  # (B,) int32
    rows: torch.Tensor,  # (B,) int64: each request's query row in ``query``/``out``
    scale: float,
    sliding_window: int | None,
    soft_cap: float | None,
) -> None:
    """Attention of one query per request over its first ``seq_lens[b]`` cached positions
    (the last ``sliding_window`` of them with a window), written to ``out[rows[b]]``."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    lib.paged_decode_f32(
        query.data_ptr(),
        kv_cache.data_ptr(),  # keys: kv_cache[0] (pointers, not views: no aten call per layer)
        kv_cache.data_ptr() + kv_cache.stride(0) * kv_cache.element_size(),  # values: kv_cache[1]
        out.data_ptr(),
        block_tables.data_ptr(),
        block_tables.stride(0),
        seq_lens.data_ptr(),
        rows.data_ptr(),
        len(rows),
        query.shape[1],
        num_kv_heads,
        head_dim,
        block_size,
        query.stride(0),
        out.stride(0),
        scale,
        sliding_window or 0,
        soft_cap or 0.0,
        torch.get_num_threads(),
    )
