"""One Triton attention kernel for mixed batches over the paged KV cache:
decode tokens and prefill chunks in the same launch.

Grid: one program per (request, query tile x KV split, KV head)::

    program (b, t * NUM_SPLITS + s, g):
        queries  [t*BLOCK_Q, (t+1)*BLOCK_Q) of request b
        heads    g*GROUP .. g*GROUP + GROUP - 1  (one GQA group)
        keys     split s of the request's visible keys (all of them when NUM_SPLITS = 1)

The query heads of one GQA group share their keys and values, so a program
stacks them into the rows of one tile and loads every K/V tile once::

    row r  ->  query  r // GROUP_PAD,  head  g*GROUP + r % GROUP_PAD
               (rows whose head slot is >= GROUP are padding, masked out)

Keys are read straight through the block table, token by token
(``block_tables[b, pos // block_size]``), so a KV tile may span several cache
blocks or part of one, and a prefill chunk may resume in the middle of a block.
Programs whose query tile lies past their request's new tokens exit at once.

Split-KV (flash decoding): with few requests, a decode batch fills few
programs, so each request's keys are cut into NUM_SPLITS ranges of
``split_len`` keys; every split writes an unnormalized partial result with its
running max and sum, and ``_combine_splits_kernel`` merges them.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from minivllm.attention.ops._validation import SUPPORTED_DTYPES, check_cache, check_launchable, check_tensor, require

LOG2E = tl.constexpr(1.4426950408889634)
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 16


@triton.jit
def _dot(a, b, FP32_DOT: tl.constexpr):
    """a @ b with an fp32 accumulator; FP32_DOT multiplies in IEEE fp32."""
    if FP32_DOT:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b)
    return c


@triton.jit
def _tanh(x):
    # 1 - 2 / (e^2x + 1) saturates cleanly to +-1 where e^2x over/underflows.
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _paged_attention_kernel(
    out_ptr,  # (T, H, D)
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,  # (NUM_SPLITS, T, H, D), (NUM_SPLITS, T, H) x2; split-KV only
    q_ptr,  # (T, H, D)
    kv_ptr,  # (2, num_blocks, block_size, Hkv, D)
    block_tables_ptr,  # (B, max_blocks)
    seq_lens_ptr,  # (B,)
    query_start_loc_ptr,  # (B + 1,)
    scale,
    soft_cap,
    window,
    split_len,
    num_tokens,
    num_heads,
    k_scale,
    v_scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kv,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFT_CAP: tl.constexpr,
    FP32_DOT: tl.constexpr,
    FP8_KV: tl.constexpr,
):
    req = tl.program_id(0)
    tile_start = (tl.program_id(1) // NUM_SPLITS) * BLOCK_Q
    split = tl.program_id(1) % NUM_SPLITS
    kv_head = tl.program_id(2)

    q_begin = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_begin
    if tile_start >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_len = seq_len - q_len  # tokens before this step's queries

    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    rows = tl.arange(0, BLOCK_M)
    q_idx = tile_start + rows // GROUP_PAD  # (BLOCK_M,) query index in the request
    head = kv_head * GROUP + rows % GROUP_PAD  # (BLOCK_M,)
    row_ok = (q_idx < q_len) & (rows % GROUP_PAD < GROUP)
    q_pos = ctx_len + q_idx  # (BLOCK_M,) absolute positions
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    io_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(
        q_ptr + (q_begin + q_idx)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :], mask=io_mask, other=0.0
    )  # (BLOCK_M, BLOCK_D)

    # Keys this program reads: [kv_lo, kv_hi), its split of those the tile can see.
    kv_lo = split * split_len
    kv_hi = tl.minimum(ctx_len + tile_start + BLOCK_Q, seq_len)
    if NUM_SPLITS > 1:
        kv_hi = tl.minimum(kv_hi, kv_lo + split_len)
    if USE_WINDOW:
        kv_lo = tl.maximum(kv_lo, ctx_len + tile_start - window + 1)

    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # running max (log2 units); finite, so
    l_i = tl.zeros([BLOCK_M], tl.float32)  # a fully masked tile rescales by exp2(0) = 1
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    block_row = block_tables_ptr + req * stride_bt
    head_off = kv_head * stride_ch
    for start in range(kv_lo, kv_hi, BLOCK_N):
        k_pos = start + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        k_ok = k_pos < kv_hi
        block_id = tl.load(block_row + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        slot_off = block_id * stride_cb + (k_pos % BLOCK_SIZE) * stride_cs + head_off  # (BLOCK_N,)
        k_t = tl.load(
            kv_ptr + slot_off[None, :] + d[:, None], mask=d_ok[:, None] & k_ok[None, :], other=0.0
        )  # (BLOCK_D, BLOCK_N)
        v = tl.load(
            kv_ptr + stride_kv + slot_off[:, None] + d[None, :], mask=k_ok[:, None] & d_ok[None, :], other=0.0
        )  # (BLOCK_N, BLOCK_D)
        if FP8_KV:  # stored / scale: scale back up in the queries' dtype
            k_t = (k_t.to(tl.float32) * k_scale).to(q.dtype)
            v = (v.to(tl.float32) * v_scale).to(q.dtype)

        s = _dot(q, k_t, FP32_DOT) * scale  # (BLOCK_M, BLOCK_N)
        if USE_SOFT_CAP:
            s = soft_cap * _tanh(s / soft_cap)
        visible = k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            visible = visible & (q_pos[:, None] - k_pos[None, :] < window)
        s = tl.where(visible, s * LOG2E, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])  # (BLOCK_M, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, FP32_DOT)
        m_i = m_new

    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # padding rows may see no key at all
        tl.store(
            out_ptr + (q_begin + q_idx)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=io_mask,
        )
    else:
        part = (split * num_tokens + q_begin + q_idx) * num_heads + head  # (BLOCK_M,) row of the partials
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=io_mask)
        tl.store(part_max_ptr + part, m_i, mask=row_ok)
        tl.store(part_sum_ptr + part, l_i, mask=row_ok)


@triton.jit
def _combine_splits_kernel(
    out_ptr,  # (T, H, D)
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,  # (NUM_SPLITS, T, H, D), (NUM_SPLITS, T, H) x2
    query_start_loc_ptr,  # (B + 1,)
    num_reqs,
    num_tokens,
    num_heads,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    """One program per (token, head): rescale each split to the common max and normalize."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    if t >= tl.load(query_start_loc_ptr + num_reqs):  # padding token
        return
    part = (tl.arange(0, NUM_SPLITS) * num_tokens + t) * num_heads + h  # (NUM_SPLITS,)
    m = tl.load(part_max_ptr + part)
    weight = tl.exp2(m - tl.max(m, 0))  # (NUM_SPLITS,); 0 for empty splits
    d = tl.arange(0, BLOCK_D)
    acc = tl.load(
        part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=d[None, :] < HEAD_DIM, other=0.0
    )  # (NUM_SPLITS, BLOCK_D)
    total = tl.sum(tl.load(part_sum_ptr + part) * weight, 0)
    out = tl.sum(acc * weight[:, None], 0) / total
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def _check_metadata(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor, device: torch.device
) -> None:
    check_tensor(query_start_loc, "query_start_loc", device, dims=1)
    check_tensor(seq_lens, "seq_lens", device, dims=1)
    check_tensor(block_tables, "block_tables", device, dims=2)
    num_reqs = seq_lens.shape[0]
    require(
        query_start_loc.shape[0] == num_reqs + 1,
        f"query_start_loc must be (B + 1,) = ({num_reqs + 1},), got {tuple(query_start_loc.shape)}",
    )
    require(
        block_tables.shape[0] == num_reqs,
        f"block_tables must have B = {num_reqs} rows, got {tuple(block_tables.shape)}",
    )
    for name, t in (("query_start_loc", query_start_loc), ("seq_lens", seq_lens), ("block_tables", block_tables)):
        require(t.dtype == torch.int32, f"{name} must be int32, got {t.dtype}")


def _tile_config(
    head_dim: int, group_pad: int, max_query_len: int, fp32: bool, capability: tuple[int, int] | None = None
) -> tuple[int, int, int]:
    """(BLOCK_Q, BLOCK_N, num_warps) for a GPU of compute ``capability`` (None: the CPU
    interpreter, which takes the Hopper tiles). A tile holds at least 16 rows (tl.dot's minimum).

    Sized so that programs do not spill registers (``python -m tools.kernel_report``
    compiles them for sm_80 and sm_90): fp32 products run on CUDA cores, not tensor cores,
    and need smaller tiles. The Hopper (sm_90) tiles were measured on an H200 (decode at
    94-100% of copy bandwidth). Before Hopper (sm_8x) ptxas needs more registers for the
    same tile, so prefill tiles at head_dim <= 128 and fp32 tiles at head_dim > 128 take
    half as many keys per step: a 64-row bf16/fp16 tile at BLOCK_N=64 there is 255
    registers and spills (188 at 32), an fp32 32-row tile at BLOCK_N=32 spills too (116
    registers at 16), and the 8-warp fp32 head_dim 256 tile spills at 32 (76 at 16)."""
    big, decode = head_dim > 128, max_query_len == 1
    if decode:
        rows = 16
    else:
        rows = (16 if big else 32) if fp32 else (32 if big else 64)
    block_n = 32 if big or fp32 else 64
    num_warps = 8 if big and (fp32 or not decode) else 4
    if capability is not None and capability < (9, 0) and ((fp32 and big) or (not big and not decode)):
        block_n //= 2
    return max(1, rows // group_pad), block_n, num_warps


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


FP8_KV_MIN_CAPABILITY = (8, 9)
"""Triton has float8_e4m3fn (its fp8e4nv) from sm_89 (Ada) on: below that neither kernel
reading or writing an fp8 KV cache compiles."""


def check_fp8_kv_capability(capability: tuple[int, int], cache_dtype: str = "fp8") -> None:
    """Refuse an fp8 KV cache (``cache.cache_dtype=cache_dtype``) on a GPU of compute
    ``capability`` where the Triton kernels cannot read it: a ValueError at start-up
    instead of a Triton compile error at the first launch."""
    if tuple(capability) < FP8_KV_MIN_CAPABILITY:
        need = ".".join(map(str, FP8_KV_MIN_CAPABILITY))
        raise ValueError(
            f"cache.cache_dtype={cache_dtype}: the Triton attention kernels need a GPU of compute capability "
            f"{need} or newer for an fp8 KV cache (this one is {capability[0]}.{capability[1]}); "
            f"use cache.cache_dtype=auto (or float16/bfloat16), or attention.name=torch"
        )


def default_num_splits(num_sms: int, programs: int, max_query_len: int, max_seq_len: int) -> int:
    """KV splits for a batch: decode batches whose ``programs`` would not fill the
    ``num_sms`` multiprocessors twice over get more, each still >= 256 keys long."""
    if max_query_len != 1:
        return 1
    wanted = triton.next_power_of_2(triton.cdiv(2 * num_sms, programs))
    affordable = 1 << (max(1, max_seq_len // MIN_KEYS_PER_SPLIT).bit_length() - 1)  # power of two, rounded down
    return min(wanted, affordable, MAX_SPLITS)


def _check_args(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    out: torch.Tensor | None,
    max_query_len: int,
    max_seq_len: int,
    sliding_window: int | None,
    logits_soft_cap: float | None,
    num_splits: int | None,
) -> None:
    device = query.device
    check_launchable(device, _paged_attention_kernel)
    check_tensor(query, "query", device, dims=3)
    require(query.dtype in SUPPORTED_DTYPES, f"query dtype must be one of {SUPPORTED_DTYPES}, got {query.dtype}")
    check_cache(kv_cache, device, query.dtype, None, query.shape[2])
    require(
        query.shape[1] % kv_cache.shape[3] == 0,
        f"num_heads {query.shape[1]} must be a multiple of the cache's num_kv_heads {kv_cache.shape[3]}",
    )
    require(
        max_query_len >= 0 and max_seq_len >= max_query_len,
        f"need 0 <= max_query_len <= max_seq_len, got {max_query_len} and {max_seq_len}",
    )
    require(sliding_window is None or sliding_window > 0, f"sliding_window must be > 0, got {sliding_window}")
    require(logits_soft_cap is None or logits_soft_cap > 0, f"logits_soft_cap must be > 0, got {logits_soft_cap}")
    require(
        num_splits is None or (num_splits >= 1 and num_splits & (num_splits - 1) == 0),
        f"num_splits must be a power of two, got {num_splits}",
    )
    if out is not None:
        check_tensor(out, "out", device, dims=3)
        require(
            out.shape == query.shape and out.dtype == query.dtype,
            f"out must be {tuple(query.shape)} {query.dtype}, got {tuple(out.shape)} {out.dtype}",
        )


def paged_attention(
    query: torch.Tensor,  # (T, H, D)
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hkv, D)
    query_start_loc: torch.Tensor,  # (B + 1,) int32
    seq_lens: torch.Tensor,  # (B,) int32
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    *,
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    out: torch.Tensor | None = None,  # (T, H, D)
    num_splits: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:  # (T, H, D)
    """Causal attention of each request's new queries over its cached tokens.

    Request ``b``'s queries are rows ``query_start_loc[b] .. query_start_loc[b+1]``
    of ``query`` and sit at the last positions of its ``seq_lens[b]`` tokens, all
    of which must already be in ``kv_cache``. ``max_query_len``/``max_seq_len``
    must bound the per-request lengths (upper bounds are fine). Rows from
    ``query_start_loc[B]`` on (padding) are left untouched in ``out``.
    ``num_splits`` (a power of two) cuts each request's keys into that many
    ranges; None picks it from the batch. A float8_e4m3fn ``kv_cache`` holds keys and
    values divided by ``k_scale``/``v_scale``, which are multiplied back on load. Metadata values are not validated
    (that would synchronize with the device); only shapes, dtypes and devices are.
    """
    _check_args(query, kv_cache, out, max_query_len, max_seq_len, sliding_window, logits_soft_cap, num_splits)
    _check_metadata(query_start_loc, seq_lens, block_tables, query.device)
    out = torch.empty_like(query) if out is None else out
    num_tokens, num_heads, head_dim = query.shape
    num_reqs, num_kv_heads = seq_lens.shape[0], kv_cache.shape[3]
    if num_tokens == 0 or num_reqs == 0 or max_query_len == 0:
        return out
    group = num_heads // num_kv_heads
    capability = _capability(query.device) if query.device.type == "cuda" else None
    block_q, block_n, num_warps = _tile_config(
        head_dim, triton.next_power_of_2(group), max_query_len, query.dtype == torch.float32, capability
    )
    num_q_tiles = triton.cdiv(max_query_len, block_q)
    if num_splits is None:  # the interpreter runs programs one by one: no point splitting there
        num_splits = (
            1
            if query.device.type != "cuda"
            else default_num_splits(
                _num_sms(query.device), num_reqs * num_q_tiles * num_kv_heads, max_query_len, max_seq_len
            )
        )
    split_len = triton.cdiv(triton.cdiv(max_seq_len, num_splits), block_n) * block_n
    partials = [out] * 3  # never touched without splits
    if num_splits > 1:
        partials = [
            torch.empty(num_splits, num_tokens, num_heads, *shape, dtype=torch.float32, device=query.device)
            for shape in ((head_dim,), (), ())
        ]  # unnormalized acc, running max, running sum
    _paged_attention_kernel[(num_reqs, num_q_tiles * num_splits, num_kv_heads)](
        out,
        *partials,
        query,
        kv_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        logits_soft_cap or 0.0,
        sliding_window or 0,
        split_len,
        num_tokens,
        num_heads,
        float(k_scale),
        float(v_scale),
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        *kv_cache.stride()[:4],
        block_tables.stride(0),
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=kv_cache.shape[2],
        GROUP=group,
        GROUP_PAD=triton.next_power_of_2(group),
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        NUM_SPLITS=num_splits,
        USE_WINDOW=sliding_window is not None,
        USE_SOFT_CAP=logits_soft_cap is not None,
        FP32_DOT=query.device.type != "cuda" or query.dtype == torch.float32,
        FP8_KV=kv_cache.dtype == torch.float8_e4m3fn,
        num_warps=num_warps,
    )
    if num_splits > 1:
        _combine_splits_kernel[(num_tokens, num_heads)](
            out,
            *partials,
            query_start_loc,
            num_reqs,
            num_tokens,
            num_heads,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            NUM_SPLITS=num_splits,
        )
    return out
