"""The fused-MoE Triton kernel: one grouped GEMM per projection over tokens sorted by expert.

``align_by_expert`` lays the (token, slot) pairs out in blocks of BLOCK_M rows,
each block belonging to one expert. A program computes one (BLOCK_M, BLOCK_N)
tile of ``A[rows] @ W[expert]^T``, gathering its rows of A through the sorted
indices and scattering the result to the pairs' own rows of C, so no permuted
copy of the activations is ever materialised::

    GEMM 1:  C1[t*k + s] = hidden[t] @ w13[e]^T                 (T*k, 2I)
             silu(gate) * up                                    (T*k, I)
    GEMM 2:  C2[t*k + s] = weight[t, s] * (act[t*k + s] @ w2[e]^T)   (T*k, H)
    combine: out[t] = sum_s C2[t*k + s]                          (T, H)

gpt-oss's experts add per-expert biases inside both GEMMs (``b13[e]`` to C1, ``b2[e]``
to C2 before the routing weight) and take its clamped SwiGLU between them
(``swiglu=(alpha, limit)``, ``layers/activation.py``).

Rows of C2 whose expert lives on another rank are never written and stay zero.

With ``MoeTiles.split_k`` > 1 (few large experts at decode: Mixtral's down GEMM has only
H / BLOCK_N programs per active expert) GEMM 2 is split along I over a second grid axis:
split s writes its fp32 partial of C2 (routing weight applied, a linear factor), and the
combine adds the splits and the k slots in fp32 before the one rounding.

The layout (``align_by_expert``): the kernel processes BLOCK_M rows at a time, all
of one expert. With ``topk_ids`` flattened to N = T * k entries, the pairs are laid
out by expert, each expert's run padded up to a multiple of BLOCK_M with the sentinel N::

    experts of 7 entries, BLOCK_M = 4:   ids = [1 0 1 1 0 1 3]
    sorted_ids     = [1 4 N N | 0 2 3 5 | 6 N N N]     (expert 2 got nothing: no block)
    block_experts  = [0       | 1       | 3      | -1 ...]
    num_padded     = 12

Everything is computed on the device without reading a value back to the host
(no ``.item()``), so the buffers have their worst-case size
``N + E * (BLOCK_M - 1)`` and blocks past ``num_padded`` carry expert -1.
Entries with id -1 (experts on other ranks) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from minivllm.attention.ops.checks import SUPPORTED_DTYPES, check_launchable, check_tensor, require
from minivllm.layers.activation import clamped_swiglu, silu_and_mul
from minivllm.layers.fused_moe.tiles import MoeTiles, choose_tiles
from minivllm.tuned_tiles import device_facts


@dataclass(frozen=True)
class AlignedRouting:
    sorted_ids: torch.Tensor
    """(max_padded,) int32: flat (token * k + slot) indices grouped by expert; N marks padding."""
    block_experts: torch.Tensor
    """(max_padded // block_m,) int32: the local expert of each block of rows; -1 = no work."""
    num_padded: torch.Tensor
    """(1,) int32: rows in use (every expert's run padded to block_m)."""


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedRouting:
    """Group the flattened ``topk_ids`` (T, k) by expert as in the module docstring."""
    flat = topk_ids.flatten()  # (N,)
    n, device = flat.numel(), flat.device
    ids = torch.where(flat < 0, torch.full_like(flat, num_experts), flat)  # -1 -> spare bucket E
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, ids, torch.ones_like(ids))  # (E+1,)
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m  # (E,)
    ends = torch.cumsum(padded, 0)  # (E,)
    starts = torch.cat([ends.new_zeros(1), ends])  # (E+1,): bucket E starts past the end
    max_padded = n + num_experts * (block_m - 1)
    max_padded = (max_padded + block_m - 1) // block_m * block_m

    sorted_e, order = torch.sort(ids, stable=True)  # (N,)
    first = torch.cumsum(counts, 0) - counts  # (E+1,) index in `order` of each expert's first entry
    rank = torch.arange(n, device=device) - first[sorted_e]
    dest = torch.where(sorted_e < num_experts, starts[sorted_e] + rank, torch.full_like(rank, max_padded))
    sorted_ids = torch.full((max_padded + 1,), n, dtype=torch.int64, device=device)
    sorted_ids.scatter_(0, dest, order)  # slot max_padded collects the left-out entries

    block_starts = torch.arange(0, max_padded, block_m, device=device)
    block_experts = torch.searchsorted(ends, block_starts, right=True)  # expert whose run covers the block
    block_experts = torch.where(block_experts < num_experts, block_experts, torch.full_like(block_experts, -1))
    return AlignedRouting(
        sorted_ids=sorted_ids[:max_padded].to(torch.int32),
        block_experts=block_experts.to(torch.int32),
        num_padded=ends[-1:].to(torch.int32) if num_experts else ends.new_zeros(1, dtype=torch.int32),
    )


@triton.jit
def _grouped_gemm_kernel(
    a_ptr,
    w_ptr,
    c_ptr,
    bias_ptr,  # (E, N) per-expert bias when HAS_BIAS
    weights_ptr,
    sorted_ids_ptr,
    block_experts_ptr,
    num_padded_ptr,
    N,
    K,
    num_valid,
    stride_am,
    stride_ak,
    stride_we,
    stride_wn,
    stride_wk,
    stride_cm,
    stride_cn,
    stride_cs,
    k_per_split,
    stride_be,
    A_ROWS_PER_ROW: tl.constexpr,  # k for GEMM 1 (row t*k+s reads hidden[t]); 1 for GEMM 2
    MUL_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FP32_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,  # row blocks swizzled together: they share their columns of W in L2
    SPLIT_K: tl.constexpr,  # programs along K (grid axis 1), each writing an fp32 partial of C
):
    pid = tl.program_id(0)
    num_n_blocks = tl.cdiv(N, BLOCK_N)
    if GROUP_M == 1:
        pid_m, pid_n = pid // num_n_blocks, pid % num_n_blocks
    else:
        num_m_blocks = tl.num_programs(0) // num_n_blocks
        group, in_group = pid // (GROUP_M * num_n_blocks), pid % (GROUP_M * num_n_blocks)
        first_m = group * GROUP_M
        group_size = tl.minimum(num_m_blocks - first_m, GROUP_M)
        pid_m, pid_n = first_m + in_group % group_size, in_group // group_size
    expert = tl.load(block_experts_ptr + pid_m)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr) or expert < 0:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(sorted_ids_ptr + offs_m).to(tl.int64)  # (BLOCK_M,) flat pair index, num_valid = padding
    row_ok = rows < num_valid
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if SPLIT_K == 1:
        k_start, k_end = 0, K
    else:
        k_start = tl.program_id(1) * k_per_split
        k_end = tl.minimum(k_start + k_per_split, K)
        c_ptr += tl.program_id(1) * stride_cs  # this split's fp32 partial
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (rows // A_ROWS_PER_ROW)[:, None] * stride_am + (k_start + offs_k)[None, :] * stride_ak
    w_ptrs = (
        w_ptr + expert.to(tl.int64) * stride_we + offs_n[None, :] * stride_wn + (k_start + offs_k)[:, None] * stride_wk
    )

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k_ok = offs_k < k_end - k0
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_K)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & (offs_n[None, :] < N), other=0.0)  # (BLOCK_K, BLOCK_N)
        if FP32_DOT:
            acc += tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(a, w)
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    if HAS_BIAS:  # the expert's own bias, before the routing weight (added by the first split only)
        if tl.program_id(1) == 0:
            bias = tl.load(bias_ptr + expert.to(tl.int64) * stride_be + offs_n, mask=offs_n < N, other=0.0)
            acc += bias.to(tl.float32)[None, :]
    if MUL_WEIGHT:
        acc *= tl.load(weights_ptr + rows, mask=row_ok, other=0.0)[:, None]
    c_ptrs = c_ptr + rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n[None, :] < N))


def _grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    routing: AlignedRouting,
    weights: torch.Tensor,
    a_rows_per_row: int,
    mul_weight: bool,
    tiles: MoeTiles,
    bias: torch.Tensor | None = None,
    splits: int = 1,
) -> None:
    """out[rows] = a[rows // a_rows_per_row] @ w[expert]^T (+ bias[expert]; times the routing weight
    when asked); with ``splits`` > 1, out is (splits, rows, N) fp32 and split s holds the sum over
    its share of K (``MoeTiles.k_per_split``), the bias in split 0's."""
    num_n = triton.cdiv(w.shape[1], tiles.block_n)
    grid = (routing.block_experts.numel() * num_n, splits)
    _grouped_gemm_kernel[grid](
        a,
        w,
        out,
        bias if bias is not None else w,
        weights,
        routing.sorted_ids,
        routing.block_experts,
        routing.num_padded,
        w.shape[1],
        w.shape[2],
        out.shape[-2],
        a.stride(0),
        a.stride(1),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        out.stride(-2),
        out.stride(-1),
        out.stride(0) if splits > 1 else 0,
        tiles.k_per_split(w.shape[2]),
        bias.stride(0) if bias is not None else 0,
        A_ROWS_PER_ROW=a_rows_per_row,
        MUL_WEIGHT=mul_weight,
        HAS_BIAS=bias is not None,
        FP32_DOT=a.dtype == torch.float32,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        GROUP_M=tiles.group_m,
        SPLIT_K=splits,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )


def triton_fused_experts(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    tiles: MoeTiles | None = None,
    *,
    b13: torch.Tensor | None = None,
    b2: torch.Tensor | None = None,
    swiglu: tuple[float, float] | None = None,
) -> torch.Tensor:
    """The Triton version of ``torch_fused_experts`` (same arguments, same result); ``tiles``
    None: the tuned table's config for this device and shape, else the heuristic's (tiles.py).
    gpt-oss's experts: ``b13`` (E, 2I) and ``b2`` (E, H) per-expert biases, ``swiglu`` (alpha,
    limit) its clamped SwiGLU instead of SiLU-and-mul (the torch loop in ``models/gpt_oss.py``)."""
    _check_inputs(hidden, w13, w2, topk_weights, topk_ids)
    E, two_i, H = w13.shape
    for name, bias, shape in (("b13", b13, (E, two_i)), ("b2", b2, (E, H))):
        if bias is not None:
            check_tensor(bias, name, hidden.device, dims=2)
            require(tuple(bias.shape) == shape, f"{name} must be {shape}, got {tuple(bias.shape)}")
    T, k = topk_ids.shape
    tiles = tiles or choose_tiles(T, E, two_i, H, k, hidden.dtype, device_facts(hidden.device))
    routing = align_by_expert(topk_ids, E, tiles.block_m)
    weights = topk_weights.to(torch.float32).contiguous().flatten()  # (T*k,)
    gate_up = torch.empty(T * k, two_i, dtype=hidden.dtype, device=hidden.device)
    _grouped_gemm(hidden, w13, gate_up, routing, weights, k, False, tiles, b13)
    act = silu_and_mul(gate_up) if swiglu is None else clamped_swiglu(gate_up, *swiglu)  # (T*k, I)
    splits = tiles.splits(act.shape[1])
    if splits > 1:  # the down GEMM split along I: fp32 partials, added with the k slots in fp32
        partials = torch.zeros(splits, T * k, H, dtype=torch.float32, device=hidden.device)
        _grouped_gemm(act, w2, partials, routing, weights, 1, True, tiles, b2, splits)
        return partials.view(splits, T, k, H).sum(dim=(0, 2)).to(hidden.dtype)
    down = torch.zeros(T * k, H, dtype=hidden.dtype, device=hidden.device)
    _grouped_gemm(act, w2, down, routing, weights, 1, True, tiles, b2)
    return down.view(T, k, H).sum(dim=1)


def _check_inputs(hidden, w13, w2, topk_weights, topk_ids) -> None:
    device = hidden.device
    check_launchable(device, _grouped_gemm_kernel)
    require(hidden.dtype in SUPPORTED_DTYPES, f"hidden dtype {hidden.dtype} is not one of {SUPPORTED_DTYPES}")
    check_tensor(hidden, "hidden", device, dims=2)
    check_tensor(w13, "w13", device, dims=3)
    check_tensor(w2, "w2", device, dims=3)
    check_tensor(topk_weights, "topk_weights", device, dims=2)
    check_tensor(topk_ids, "topk_ids", device, dims=2)
    E, two_i, H = w13.shape
    require(
        w13.dtype == hidden.dtype and w2.dtype == hidden.dtype,
        f"w13/w2 dtypes {w13.dtype}/{w2.dtype} must equal hidden's {hidden.dtype}",
    )
    require(hidden.shape[1] == H, f"hidden has {hidden.shape[1]} features, w13 expects {H}")
    require(
        two_i % 2 == 0 and tuple(w2.shape) == (E, H, two_i // 2),
        f"w2 must be (E, H, I) = {(E, H, two_i // 2)} for w13 {tuple(w13.shape)}, got {tuple(w2.shape)}",
    )
    require(
        topk_ids.shape == topk_weights.shape and topk_ids.shape[0] == hidden.shape[0],
        f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must both be "
        f"(tokens={hidden.shape[0]}, k)",
    )
    require(not topk_ids.is_floating_point(), f"topk_ids must be integer, got {topk_ids.dtype}")
