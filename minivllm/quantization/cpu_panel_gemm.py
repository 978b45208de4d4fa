"""fp32 GEMM on the CPU over a weight packed once into column panels: a C kernel for every batch.

A decode step multiplies a few to a few dozen rows by every weight of the model. At those row counts
oneDNN's packed matmul ran at 50-65% of this machine's FMA peak (benchmarks/RESULTS.md): each
weight streams in from memory once a step, and its kernel waits on that stream before computing on
it. This one overlaps the two. ``pack_panels`` lays the (out, in) weight out once, at load, as
panels of ``PANEL`` output columns, each a (in, PANEL) block read front to back; the kernel runs
register tiles of 8 rows of x by one panel (24 AVX-512 accumulators, x broadcast a scalar at a time)
down the panel, and while it computes on one panel it prefetches the next into L2, spread over the
tiles of the current one. From 8 rows on the weights stream at the copy bandwidth or the FMAs run
near their peak, whichever binds: 1.4-1.6x oneDNN at 8-32 rows on one thread, level or ahead at
prefill sizes. The inner dimension runs in chunks of ``K_CHUNK`` so that a panel's chunk stays in
L2 however wide the layer.

Layout: ``panels`` (ceil(out / PANEL), in, PANEL) fp32, columns past ``out`` zero. Threads
(``torch.get_num_threads()``, OpenMP) split the panels, one per 2**21 multiply-adds at most, so a
small product stays on the calling thread. Sums run over the inner dimension in order, in fp32:
equal to ``F.linear`` to fp32 rounding. Built and cached like the other C kernels
(``minivllm/c_kernels.py``); where it cannot be, ``pack_cpu_weight`` keeps oneDNN's reordered copy.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from minivllm.c_kernels import CLibrary, profiled
from minivllm.quantization import cpu_small_gemm

PANEL = 48
"""Output columns a panel holds: three AVX-512 vectors, so 8 rows x 3 vectors of accumulators, the
weights' three vectors and one broadcast fit AVX-512's 32 registers."""

K_CHUNK = 1024
"""Inner-dimension chunk: a panel's chunk (192 KiB) stays in L2 while every tile of rows reads it."""

_SOURCE = r"""
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define PANEL 48
#define TILE_ROWS 8
#define K_CHUNK 1024

/* y (rows, PANEL) ys apart = [y +] x (rows, kc) xs apart @ panel (kc, PANEL) [+ bias]. While it runs,
   prefetches pf_lines 64-byte lines from pf into L2, spread evenly over its kc steps. */
static inline __attribute__((always_inline)) void tile(const float* x, int64_t xs, const float* panel,
                                                       int64_t kc, float* y, int64_t ys, int accumulate,
                                                       const float* bias, const int rows, const char* pf,
                                                       int64_t pf_lines) {
#if defined(__AVX512F__)
    __m512 acc[TILE_ROWS][3];
    for (int i = 0; i < rows; ++i)
        for (int j = 0; j < 3; ++j)
            acc[i][j] = accumulate ? _mm512_loadu_ps(y + i * ys + 16 * j) : _mm512_setzero_ps();
    const int64_t pf_step = (pf_lines + kc - 1) / kc;
    int64_t p = 0;
    for (int64_t k = 0; k < kc; ++k) {
        for (int64_t q = 0; q < pf_step && p < pf_lines; ++q, ++p) _mm_prefetch(pf + 64 * p, _MM_HINT_T1);
        const float* w = panel + k * PANEL;
        const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32);
        for (int i = 0; i < rows; ++i) {
            const __m512 xv = _mm512_set1_ps(x[i * xs + k]);
            acc[i][0] = _mm512_fmadd_ps(xv, w0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(xv, w1, acc[i][1]);
            acc[i][2] = _mm512_fmadd_ps(xv, w2, acc[i][2]);
        }
    }
    for (int j = 0; j < 3; ++j) {
        const __m512 b = bias ? _mm512_loadu_ps(bias + 16 * j) : _mm512_setzero_ps();
        for (int i = 0; i < rows; ++i) _mm512_storeu_ps(y + i * ys + 16 * j, _mm512_add_ps(acc[i][j], b));
    }
#else
    (void)pf;
    (void)pf_lines;
    for (int i = 0; i < rows; ++i) {
        float acc[PANEL];
        for (int c = 0; c < PANEL; ++c) acc[c] = accumulate ? y[i * ys + c] : 0.f;
        for (int64_t k = 0; k < kc; ++k) {
            const float xv = x[i * xs + k];
#pragma omp simd
            for (int c = 0; c < PANEL; ++c) acc[c] += xv * panel[k * PANEL + c];
        }
        for (int c = 0; c < PANEL; ++c) y[i * ys + c] = acc[c] + (bias ? bias[c] : 0.f);
    }
#endif
}

static void tile_rows(const float* x, int64_t xs, const float* panel, int64_t kc, float* y, int64_t ys,
                      int64_t cols, int accumulate, const float* bias, int rows, const char* pf,
                      int64_t pf_lines) {
    if (cols < PANEL) { /* the last panel: its valid columns through a whole panel's tile on the stack */
        float part[TILE_ROWS * PANEL], part_bias[PANEL];
        for (int i = 0; i < rows; ++i)
            for (int64_t c = 0; c < PANEL; ++c) part[i * PANEL + c] = accumulate && c < cols ? y[i * ys + c] : 0.f;
        for (int64_t c = 0; c < PANEL; ++c) part_bias[c] = bias && c < cols ? bias[c] : 0.f;
        tile_rows(x, xs, panel, kc, part, PANEL, PANEL, accumulate, bias ? part_bias : NULL, rows, pf, pf_lines);
        for (int i = 0; i < rows; ++i)
            for (int64_t c = 0; c < cols; ++c) y[i * ys + c] = part[i * PANEL + c];
        return;
    }
    switch (rows) {  /* a constant row count each, so the accumulators stay in registers */
    case 1: tile(x, xs, panel, kc, y, ys, accumulate, bias, 1, pf, pf_lines); break;
    case 2: tile(x, xs, panel, kc, y, ys, accumulate, bias, 2, pf, pf_lines); break;
    case 3: tile(x, xs, panel, kc, y, ys, accumulate, bias, 3, pf, pf_lines); break;
    case 4: tile(x, xs, panel, kc, y, ys, accumulate, bias, 4, pf, pf_lines); break;
    case 5: tile(x, xs, panel, kc, y, ys, accumulate, bias, 5, pf, pf_lines); break;
    case 6: tile(x, xs, panel, kc, y, ys, accumulate, bias, 6, pf, pf_lines); break;
    case 7: tile(x, xs, panel, kc, y, ys, accumulate, bias, 7, pf, pf_lines); break;
    default: tile(x, xs, panel, kc, y, ys, accumulate, bias, 8, pf, pf_lines); break;
    }
}

/* y (M, N) rows ys apart = x (M, K) rows xs apart @ W^T (+ bias (N,) or null), W packed as
   panels (ceil(N / PANEL), K, PANEL). The last panel's columns past N are neither read from bias
   nor written (its tiles go through a buffer on the stack). Each thread of the team takes a contiguous, even share of the panels. */
void panel_gemm_f32(const float* x, int64_t xs, const float* panels, const float* bias, float* y, int64_t ys,
                    int64_t M, int64_t N, int64_t K, int num_threads) {
    if (M <= 0 || N <= 0) return;
    const int64_t num_panels = (N + PANEL - 1) / PANEL;
    const int64_t tiles = (M + TILE_ROWS - 1) / TILE_ROWS;
    int64_t nt = (M * N * K) >> 21;
    nt = nt < 1 ? 1 : (nt < num_threads ? nt : num_threads);
    nt = nt < num_panels ? nt : num_panels;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        /* the team OpenMP gave, which may be smaller than asked for (OMP_THREAD_LIMIT, nesting) */
        const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
        const int64_t first = t * num_panels / team, last = (t + 1) * num_panels / team;
        for (int64_t pi = first; pi < last; ++pi) {
            const int64_t n = pi * PANEL, cols = N - n < PANEL ? N - n : PANEL;
            const float* panel = panels + n * K;
            for (int64_t k0 = 0; k0 < K; k0 += K_CHUNK) {
                const int64_t kc = K - k0 < K_CHUNK ? K - k0 : K_CHUNK;
                /* what streams next: this panel's next chunk, else this thread's next panel */
                const float* next = k0 + kc < K ? panel + (k0 + kc) * PANEL : (pi + 1 < last ? panel + K * PANEL : NULL);
                const int64_t next_k = k0 + kc < K ? (K - k0 - kc < K_CHUNK ? K - k0 - kc : K_CHUNK)
                                                   : (K < K_CHUNK ? K : K_CHUNK);
                const int64_t lines = next ? (next_k * PANEL * 4 + 63) / 64 : 0;
                const int64_t lines_per_tile = (lines + tiles - 1) / tiles;
                for (int64_t ti = 0; ti < tiles; ++ti) {
                    const int64_t m = ti * TILE_ROWS, rows = M - m < TILE_ROWS ? M - m : TILE_ROWS;
                    const int64_t lo = ti * lines_per_tile;
                    const int64_t count = lo < lines ? (lines - lo < lines_per_tile ? lines - lo : lines_per_tile) : 0;
                    tile_rows(x + m * xs + k0, xs, panel + k0 * PANEL, kc, y + m * ys + n, ys, cols, k0 > 0,
                              k0 + kc >= K && bias ? bias + n : NULL, (int)rows,
                              count ? (const char*)next + 64 * lo : NULL, count);
                }
            }
        }
    }
}
"""

LIBRARY = CLibrary(
    "panel_gemm",
    _SOURCE,
    "fp32 linear layers use oneDNN's packed matmul",
    {"panel_gemm_f32": cpu_small_gemm.GEMM_ARGTYPES},  # one signature: the decode stack calls either
)


def load() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot be (oneDNN's packed matmul serves)."""
    return LIBRARY.get()


@dataclass(frozen=True)
class PanelWeight:
    """An (out, in) fp32 weight packed for ``panel_linear``: ``panels`` (ceil(out / PANEL), in, PANEL),
    the columns past ``out_features`` zero. A copy: whatever writes the weight packs it again."""

    panels: torch.Tensor
    out_features: int

    @property
    def nbytes(self) -> int:
        return self.panels.numel() * self.panels.element_size()


def pack_panels(weight: torch.Tensor) -> PanelWeight:
    """``weight`` (out, in) fp32 on the CPU laid out as panels, in memory advised for huge pages
    (``cpu_small_gemm.huge_page_empty``: a step streams every panel once). Raises where the kernel is
    not built (``load()`` None): the caller keeps oneDNN's copy then."""
    if load() is None:
        raise RuntimeError("the CPU panel GEMM is not built; pack for oneDNN instead")
    out, inner = weight.shape
    num, full = -(-out // PANEL), out // PANEL
    shape = (num, inner, PANEL)
    panels = cpu_small_gemm.huge_page_empty(shape, torch.float32)
    if panels is None:
        panels = torch.empty(shape, dtype=torch.float32)
    w = weight.detach()
    panels[:full].copy_(w[: full * PANEL].reshape(full, PANEL, inner).transpose(1, 2))  # no padded temporary
    if full < num:
        panels[full].zero_()
        panels[full, :, : out - full * PANEL].copy_(w[full * PANEL :].t())
    return PanelWeight(panels, out)


def panel_linear(
    x: torch.Tensor,  # (..., in) fp32
    packed: PanelWeight,
    bias: torch.Tensor | None,  # (out,) fp32
) -> torch.Tensor:  # (..., out) fp32
    """``F.linear(x, W, bias)`` for ``packed = pack_panels(W)``."""
    lead, inner = x.shape[:-1], x.shape[-1]
    if x.dtype != torch.float32 or inner != packed.panels.shape[1]:
        raise ValueError(
            f"panel_linear: x is {x.dtype} with {inner} features; the packed weight takes float32 with "
            f"{packed.panels.shape[1]}"
        )
    x2 = x.reshape(-1, inner)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows, out = x2.shape[0], packed.out_features
    y = torch.empty((rows, out), dtype=torch.float32)
    if rows:
        if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
            bias = bias.float().contiguous()
        with profiled("cpu_panel_gemm"):
            LIBRARY.loaded.panel_gemm_f32(  # type: ignore[union-attr]
                x2.data_ptr(),
                x2.stride(0),
                packed.panels.data_ptr(),
                bias.data_ptr() if bias is not None else None,
                y.data_ptr(),
                out,
                rows,
                out,
                inner,
                torch.get_num_threads(),
            )
    return y.view(*lead, out)
