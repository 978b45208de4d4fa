"""The Triton kernels of paged attention over mixed batches: decode tokens and
prefill chunks in the same launch. ``triton_paged_attention.py`` checks the
arguments, picks the tiles and splits (``paged_attention_tiles.py``) and launches them.

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

Attention sinks (gpt-oss, ``USE_SINKS``): each head has a learned logit that joins the
softmax's denominator and contributes no value, ``out = sum_j e^(s_j) v_j / (sum_j e^(s_j) +
e^sink)``. It is added once, where the sum is final: when the kernel normalizes (one split)
or in ``_combine_splits_kernel`` (several).
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


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
    sinks_ptr,  # (H,) sink logits (read as fp32); USE_SINKS only
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
    USE_SINKS: tl.constexpr,
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
        if USE_SINKS:  # the sink's share of the denominator, in the running max's units
            sink = tl.load(sinks_ptr + head, mask=row_ok, other=0.0).to(tl.float32)
            l_i += tl.exp2(tl.where(row_ok, sink * LOG2E - m_i, float("-inf")))
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
    sinks_ptr,  # (H,) sink logits (read as fp32); USE_SINKS only
    num_reqs,
    num_tokens,
    num_heads,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    USE_SINKS: tl.constexpr,
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
    if USE_SINKS:
        total += tl.exp2(tl.load(sinks_ptr + h).to(tl.float32) * LOG2E - tl.max(m, 0))
    out = tl.sum(acc * weight[:, None], 0) / total
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)
