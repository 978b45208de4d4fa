"""Triton kernels for the paged KV cache: the KV write and one attention kernel
for mixed batches (decode tokens and prefill chunks in the same launch).

Attention grid: one program per (request, query tile, KV head)::

    program (b, t, g):  queries  [t*BLOCK_Q, (t+1)*BLOCK_Q) of request b
                        heads    g*GROUP .. g*GROUP + GROUP - 1  (one GQA group)

The query heads of one GQA group share their keys and values, so a program
stacks them into the rows of one tile and loads every K/V tile once::

    row r  ->  query  r // GROUP_PAD,  head  g*GROUP + r % GROUP_PAD
               (rows whose head slot is >= GROUP are padding, masked out)

Keys are read straight through the block table, token by token
(``block_tables[b, pos // block_size]``), so a KV tile may span several cache
blocks or part of one, and a prefill chunk may resume in the middle of a block.
Programs whose query tile lies past their request's new tokens exit at once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LOG2E = 1.4426950408889634


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr,  # (T, Hkv, D)
    kv_ptr,  # (2, num_blocks, block_size, Hkv, D)
    slot_mapping_ptr,  # (T,)
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kv, stride_cb, stride_cs, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    """One program per token: copy all of its KV heads into its slot."""
    t = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:  # padding token
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
    k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    dst = kv_ptr + (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + h * stride_ch + d
    tl.store(dst, k, mask=mask)
    tl.store(dst + stride_kv, v, mask=mask)


@triton.jit
def _dot(a, b, FP32_DOT: tl.constexpr):
    """a @ b with an fp32 accumulator; FP32_DOT multiplies in IEEE fp32."""
    if FP32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _tanh(x):
    # 1 - 2 / (e^2x + 1) saturates cleanly to +-1 where e^2x over/underflows.
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _paged_attention_kernel(
    out_ptr,  # (T, H, D)
    q_ptr,  # (T, H, D)
    kv_ptr,  # (2, num_blocks, block_size, Hkv, D)
    block_tables_ptr,  # (B, max_blocks)
    seq_lens_ptr,  # (B,)
    query_start_loc_ptr,  # (B + 1,)
    scale, soft_cap, window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kv, stride_cb, stride_cs, stride_ch, stride_bt,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_SOFT_CAP: tl.constexpr, FP32_DOT: tl.constexpr,
):
    req = tl.program_id(0)
    tile_start = tl.program_id(1) * BLOCK_Q
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
    q = tl.load(q_ptr + (q_begin + q_idx)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=io_mask, other=0.0)  # (BLOCK_M, BLOCK_D)

    # Keys this tile can see: [kv_lo, kv_hi).
    kv_hi = tl.minimum(ctx_len + tile_start + BLOCK_Q, seq_len)
    kv_lo = 0
    if USE_WINDOW:
        kv_lo = tl.maximum(ctx_len + tile_start - window + 1, 0)

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
        k_t = tl.load(kv_ptr + slot_off[None, :] + d[:, None],
                      mask=d_ok[:, None] & k_ok[None, :], other=0.0)  # (BLOCK_D, BLOCK_N)
        v = tl.load(kv_ptr + stride_kv + slot_off[:, None] + d[None, :],
                    mask=k_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)

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

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # padding rows may see no key at all
    tl.store(out_ptr + (q_begin + q_idx)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=io_mask)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _check_tensor(t: torch.Tensor, name: str, device: torch.device, dims: int) -> None:
    """Same device as the query, the expected rank, unit stride in the last dim."""
    _require(t.device == device, f"{name} is on {t.device}, expected {device} (the device of the other inputs)")
    _require(t.dim() == dims, f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    _require(t.shape[-1] <= 1 or t.stride(-1) == 1,
             f"{name} must have unit stride in its last dim, got strides {t.stride()}")


def _check_launchable(device: torch.device) -> None:
    interpreted = isinstance(_paged_attention_kernel, InterpretedFunction)
    _require(device.type == "cuda" or (device.type == "cpu" and interpreted),
             f"Triton kernels need CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set "
             f"before triton kernels are defined; got {device} tensors (interpreter "
             f"{'on' if interpreted else 'off'})")


def _check_cache(kv_cache: torch.Tensor, device: torch.device, dtype: torch.dtype,
                 num_kv_heads: int | None, head_dim: int) -> None:
    _check_tensor(kv_cache, "kv_cache", device, dims=5)
    _require(kv_cache.shape[0] == 2,
             f"kv_cache must be (2, num_blocks, block_size, num_kv_heads, head_dim), got {tuple(kv_cache.shape)}")
    _require(kv_cache.shape[4] == head_dim, f"kv_cache head_dim {kv_cache.shape[4]} != inputs' {head_dim}")
    _require(num_kv_heads is None or kv_cache.shape[3] == num_kv_heads,
             f"kv_cache has {kv_cache.shape[3]} KV heads, inputs have {num_kv_heads}")
    _require(kv_cache.dtype == dtype, f"kv_cache dtype {kv_cache.dtype} != inputs' {dtype}")


def write_kv(
    key: torch.Tensor,  # (T, Hkv, D)
    value: torch.Tensor,  # (T, Hkv, D)
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hkv, D)
    slot_mapping: torch.Tensor,  # (T,) int64; < 0 means padding, not written
) -> None:
    """Store each token's key and value at its slot ``block_id * block_size + offset``."""
    device = key.device
    _check_launchable(device)
    _check_tensor(key, "key", device, dims=3)
    _check_tensor(value, "value", device, dims=3)
    _check_tensor(slot_mapping, "slot_mapping", device, dims=1)
    num_tokens, num_kv_heads, head_dim = key.shape
    _require(value.shape == key.shape, f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}")
    _require(key.dtype in SUPPORTED_DTYPES and value.dtype == key.dtype,
             f"key/value dtypes must match and be one of {SUPPORTED_DTYPES}, got {key.dtype}/{value.dtype}")
    _check_cache(kv_cache, device, key.dtype, num_kv_heads, head_dim)
    _require(slot_mapping.shape[0] == num_tokens and slot_mapping.dtype in (torch.int32, torch.int64),
             f"slot_mapping must be ({num_tokens},) int64, got {tuple(slot_mapping.shape)} {slot_mapping.dtype}")
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key, value, kv_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        *kv_cache.stride()[:4],
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=kv_cache.shape[2],
    )


def _check_metadata(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                    device: torch.device) -> None:
    _check_tensor(query_start_loc, "query_start_loc", device, dims=1)
    _check_tensor(seq_lens, "seq_lens", device, dims=1)
    _check_tensor(block_tables, "block_tables", device, dims=2)
    num_reqs = seq_lens.shape[0]
    _require(query_start_loc.shape[0] == num_reqs + 1,
             f"query_start_loc must be (B + 1,) = ({num_reqs + 1},), got {tuple(query_start_loc.shape)}")
    _require(block_tables.shape[0] == num_reqs,
             f"block_tables must have B = {num_reqs} rows, got {tuple(block_tables.shape)}")
    for name, t in (("query_start_loc", query_start_loc), ("seq_lens", seq_lens), ("block_tables", block_tables)):
        _require(t.dtype == torch.int32, f"{name} must be int32, got {t.dtype}")


def _tile_config(head_dim: int, group_pad: int, max_query_len: int) -> tuple[int, int, int]:
    """(BLOCK_Q, BLOCK_N, num_warps). A tile holds at least 16 rows (tl.dot's minimum)."""
    rows = 16 if max_query_len == 1 else (64 if head_dim <= 128 else 32)
    block_q = max(1, rows // group_pad)
    block_n = 64 if head_dim <= 128 else 32
    num_warps = 8 if head_dim > 128 and max_query_len > 1 else 4
    return block_q, block_n, num_warps


def paged_attention(
    query: torch.Tensor,  # (T, H, D)
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hkv, D)
    query_start_loc: torch.Tensor,  # (B + 1,) int32
    seq_lens: torch.Tensor,  # (B,) int32
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    *,
    max_query_len: int,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    out: torch.Tensor | None = None,  # (T, H, D)
) -> torch.Tensor:  # (T, H, D)
    """Causal attention of each request's new queries over its cached tokens.

    Request ``b``'s queries are rows ``query_start_loc[b] .. query_start_loc[b+1]``
    of ``query`` and sit at the last positions of its ``seq_lens[b]`` tokens, all
    of which must already be in ``kv_cache``. Rows from ``query_start_loc[B]`` on
    (padding) are left untouched in ``out``. Metadata values are not validated
    (that would synchronize with the device); only shapes, dtypes and devices are.
    """
    device = query.device
    _check_launchable(device)
    _check_tensor(query, "query", device, dims=3)
    num_tokens, num_heads, head_dim = query.shape
    _require(query.dtype in SUPPORTED_DTYPES, f"query dtype must be one of {SUPPORTED_DTYPES}, got {query.dtype}")
    _check_cache(kv_cache, device, query.dtype, None, head_dim)
    num_kv_heads = kv_cache.shape[3]
    _require(num_heads % num_kv_heads == 0,
             f"num_heads {num_heads} must be a multiple of the cache's num_kv_heads {num_kv_heads}")
    _check_metadata(query_start_loc, seq_lens, block_tables, device)
    _require(max_query_len >= 0, f"max_query_len must be >= 0, got {max_query_len}")
    _require(sliding_window is None or sliding_window > 0, f"sliding_window must be > 0, got {sliding_window}")
    _require(logits_soft_cap is None or logits_soft_cap > 0, f"logits_soft_cap must be > 0, got {logits_soft_cap}")
    if out is None:
        out = torch.empty_like(query)
    _check_tensor(out, "out", device, dims=3)
    _require(out.shape == query.shape and out.dtype == query.dtype,
             f"out must be {tuple(query.shape)} {query.dtype}, got {tuple(out.shape)} {out.dtype}")

    num_reqs = seq_lens.shape[0]
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_q, block_n, num_warps = _tile_config(head_dim, group_pad, max_query_len)
    if num_tokens == 0 or num_reqs == 0 or max_query_len == 0:
        return out
    grid = (num_reqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    _paged_attention_kernel[grid](
        out, query, kv_cache, block_tables, seq_lens, query_start_loc,
        scale, logits_soft_cap or 0.0, sliding_window or 0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        *kv_cache.stride()[:4], block_tables.stride(0),
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_SIZE=kv_cache.shape[2],
        GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, BLOCK_N=block_n,
        USE_WINDOW=sliding_window is not None, USE_SOFT_CAP=logits_soft_cap is not None,
        FP32_DOT=device.type != "cuda" or query.dtype == torch.float32,
        num_warps=num_warps,
    )
    return out
