"""A few rows against a plain fp32 weight on the CPU: a C kernel for decode at batch 1-4.

At one to four rows a linear layer is a pass over its weight, bound by memory bandwidth: oneDNN's
matmul on its reordered copy (``pack_cpu_weight``) reaches about 34 GB/s on one thread of this
machine, a dot product per weight row over the plain (out, in) weight about 38 GB/s, and 40 GB/s when
the weight lies in transparent huge pages (fewer TLB misses on a 400 MB stream; benchmarks/RESULTS.md).
So the unquantized linear layers and the LM head run ``small_linear`` on their plain weight (the
parameter, which weight updates write in place; nothing is copied for it) at one row where their
packed copy is fp32 panels (``cpu_panel_gemm``, faster from two rows on) and at up to
``SMALL_ROWS`` rows where it is oneDNN's; the packed copy serves the larger batches.

The kernel reads each weight row once for all the rows of x (two AVX-512 accumulators per row of x,
so the sums are not bound by the FMA latency; plain C with ``omp simd`` elsewhere) and splits the
weight rows over ``torch.get_num_threads()`` OpenMP threads, one per 2**22 weights (16 MB): a
stream bound by memory gains little from a second thread, and waking one costs more than a layer of a
few MB takes to read (on this 2-core VM one row over the 768-hidden Llama took 11.9-12.0 ms at two
threads with one per 2**18 weights, 10.5-11.2 at one thread, 10.9-11.0 with one per 2**22), so the
layers stay on the calling thread and the LM head (25M weights) splits. The sums run in another order than ``F.linear``'s: equal to fp32
rounding. ``to_huge_pages`` moves a weight into memory advised for huge pages, where the kernel
reads it fastest. Built and cached like the other C kernels (``minivllm/c_kernels.py``); None where it
cannot be, and the packed oneDNN path runs at every batch.
"""

from __future__ import annotations

import ctypes
import math

import torch

from minivllm.c_kernels import CLibrary, profiled

SMALL_ROWS = 4
"""Rows up to which ``small_linear`` runs instead of oneDNN's packed matmul (1-4 rows measured faster);
against fp32 panels (``cpu_panel_gemm``) it runs one row only."""

_SOURCE = r"""
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* out[m] = (x + m * xs) . w over K, for M (<= 4) rows of x: one pass over the weight row. */
static inline __attribute__((always_inline)) void dots(const float* x, int64_t xs, const float* w,
                                                       int64_t K, float* out, const int M) {
#if defined(__AVX512F__)
    __m512 a0[4], a1[4];
    for (int m = 0; m < M; ++m) {
        a0[m] = _mm512_setzero_ps();
        a1[m] = _mm512_setzero_ps();
    }
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        const __m512 w0 = _mm512_loadu_ps(w + k), w1 = _mm512_loadu_ps(w + k + 16);
        for (int m = 0; m < M; ++m) {
            a0[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * xs + k), w0, a0[m]);
            a1[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * xs + k + 16), w1, a1[m]);
        }
    }
    for (int m = 0; m < M; ++m) {
        float s = _mm512_reduce_add_ps(_mm512_add_ps(a0[m], a1[m]));
        for (int64_t j = k; j < K; ++j) s += x[m * xs + j] * w[j];
        out[m] = s;
    }
#else
    for (int m = 0; m < M; ++m) {
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t k = 0; k < K; ++k) s += x[m * xs + k] * w[k];
        out[m] = s;
    }
#endif
}

/* y (M, N) rows ys apart = x (M, K) rows xs apart @ w (N, K) contiguous ^T (+ bias (N,) or null); M <= 4. */
void small_gemm_f32(const float* x, int64_t xs, const float* w, const float* bias, float* y, int64_t ys,
                    int64_t M, int64_t N, int64_t K, int num_threads) {
    int64_t nt = (N * K) >> 22;
    nt = nt < 1 ? 1 : (nt < num_threads ? nt : num_threads);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t n = 0; n < N; ++n) {
        float s[4];
        const float* wr = w + n * K;
        switch (M) {
        case 1: dots(x, xs, wr, K, s, 1); break;
        case 2: dots(x, xs, wr, K, s, 2); break;
        case 3: dots(x, xs, wr, K, s, 3); break;
        default: dots(x, xs, wr, K, s, 4); break;
        }
        const float b = bias ? bias[n] : 0.f;
        for (int64_t m = 0; m < M; ++m) y[m * ys + n] = s[m] + b;
    }
}
"""

_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
GEMM_ARGTYPES = [ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 4 + [ctypes.c_int]
"""(x, x row stride, weight, bias, y, y row stride, M, N, K, threads): the signature this kernel and the
panel GEMM (``cpu_panel_gemm``) share, so that the C decode stack (``models/llama_cpu_decode.py``)
calls either through one function-pointer type."""
LIBRARY = CLibrary("small_gemm", _SOURCE, "small batches use oneDNN's packed matmul", {"small_gemm_f32": GEMM_ARGTYPES})


def load() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot be (oneDNN serves every batch)."""
    return LIBRARY.get()


def serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``small_linear`` takes these: 1-``SMALL_ROWS`` fp32 rows (last dim contiguous) on the
    CPU against a contiguous fp32 (out, in) weight, with the kernel built."""
    return (
        x.dim() == 2
        and 0 < x.shape[0] <= SMALL_ROWS
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.stride(1) == 1
        and weight.is_contiguous()
        and LIBRARY.get() is not None
    )


def small_linear(
    x: torch.Tensor,  # (M, in) fp32, M <= SMALL_ROWS, rows contiguous
    weight: torch.Tensor,  # (out, in) fp32 contiguous
    bias: torch.Tensor | None,  # (out,) fp32
) -> torch.Tensor:  # (M, out) fp32
    """``F.linear(x, weight, bias)`` for the few rows ``serves`` accepts."""
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), dtype=torch.float32)
    with profiled("cpu_small_gemm"):
        LIBRARY.loaded.small_gemm_f32(  # type: ignore[union-attr]
            x.data_ptr(),
            x.stride(0),
            weight.data_ptr(),
            bias.data_ptr() if bias is not None else None,
            y.data_ptr(),
            N,
            M,
            N,
            K,
            torch.get_num_threads(),
        )
    return y


def huge_page_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
    """An uninitialised contiguous CPU tensor starting on a 2 MiB boundary, advised for transparent
    huge pages before it is first touched (``madvise``). The tail past its last whole 2 MiB page is
    advised too where rounding it up to a huge page adds at most 1/8 of the tensor (the qkv and gate/up
    projections, the LM head); otherwise it stays in small pages, so that no huge page is left mostly
    empty. None where the kernel is not built, the tensor is under 2 MiB or the advice fails."""
    nbytes = math.prod(shape) * dtype.itemsize
    if load() is None or nbytes < _HUGE_PAGE:
        return None
    advised = nbytes - nbytes % _HUGE_PAGE
    if nbytes % _HUGE_PAGE and _HUGE_PAGE - nbytes % _HUGE_PAGE <= nbytes // 8:
        advised += _HUGE_PAGE
    raw = torch.empty(max(nbytes, advised) + _HUGE_PAGE, dtype=torch.uint8)  # untouched: mmap'd, not faulted in
    start = -raw.data_ptr() % _HUGE_PAGE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.madvise(raw.data_ptr() + start, advised, _MADV_HUGEPAGE) != 0:
        return None
    return raw[start : start + nbytes].view(dtype).view(shape)


def to_huge_pages(weight: torch.Tensor) -> torch.Tensor:
    """A copy of the contiguous CPU tensor ``weight`` in ``huge_page_empty`` memory; ``weight`` itself
    where that gives none, or where it already starts on a 2 MiB boundary (placed by an earlier call: a
    repack after a weight update copies nothing)."""
    if not weight.is_contiguous() or weight.data_ptr() % _HUGE_PAGE == 0:
        return weight
    placed = huge_page_empty(tuple(weight.shape), weight.dtype)
    return weight if placed is None else placed.copy_(weight)
