"""``paged_attention``: causal attention of each request's new queries over the
paged KV cache, one launch for a mixed batch of decode tokens and prefill chunks.

The wrapper checks shapes, dtypes and devices (never metadata values: that would
synchronize with the device), picks the tiles and the KV splits
(``paged_attention_tiles.py``) and launches ``_paged_attention_kernel``, then, with
more than one split, ``_combine_splits_kernel`` (``paged_attention_kernels.py``: the
grid and the tile layout). Without splits the kernel writes ``out`` itself and the
partial buffers are never touched; with them it writes unnormalized fp32 partials of
(NUM_SPLITS, T, H[, D]) that the combine kernel merges into ``out``.
"""

from __future__ import annotations

import torch
import triton

from minivllm.attention.ops.checks import SUPPORTED_DTYPES, check_cache, check_launchable, check_tensor, require
from minivllm.attention.ops.paged_attention_kernels import _combine_splits_kernel, _paged_attention_kernel
from minivllm.attention.ops.paged_attention_tiles import default_num_splits, tile_config
from minivllm.tuned_tiles import device_facts


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
    sinks: torch.Tensor | None = None,  # (H,)
) -> torch.Tensor:  # (T, H, D)
    """Causal attention of each request's new queries over its cached tokens.

    Request ``b``'s queries are rows ``query_start_loc[b] .. query_start_loc[b+1]``
    of ``query`` and sit at the last positions of its ``seq_lens[b]`` tokens, all
    of which must already be in ``kv_cache``. ``max_query_len``/``max_seq_len``
    must bound the per-request lengths (upper bounds are fine). Rows from
    ``query_start_loc[B]`` on (padding) are left untouched in ``out``.
    ``num_splits`` (a power of two) cuts each request's keys into that many
    ranges; None picks it from the batch. A float8_e4m3fn ``kv_cache`` holds keys and
    values divided by ``k_scale``/``v_scale``, which are multiplied back on load. ``sinks`` holds one
    learned logit per head that joins each softmax's denominator (gpt-oss). Metadata values are not validated
    (that would synchronize with the device); only shapes, dtypes and devices are.
    """
    _check_args(query, kv_cache, out, max_query_len, max_seq_len, sliding_window, logits_soft_cap, num_splits)
    _check_metadata(query_start_loc, seq_lens, block_tables, query.device)
    if sinks is not None:
        check_tensor(sinks, "sinks", query.device, dims=1)
        require(sinks.shape[0] == query.shape[1], f"sinks must be (H,) = ({query.shape[1]},), got {tuple(sinks.shape)}")
    out = torch.empty_like(query) if out is None else out
    num_tokens, num_heads, head_dim = query.shape
    num_reqs, num_kv_heads = seq_lens.shape[0], kv_cache.shape[3]
    if num_tokens == 0 or num_reqs == 0 or max_query_len == 0:
        return out
    group = num_heads // num_kv_heads
    facts = device_facts(query.device)
    capability = divmod(facts.arch, 10) if facts.arch is not None else None
    block_q, block_n, num_warps = tile_config(
        head_dim, triton.next_power_of_2(group), max_query_len, query.dtype == torch.float32, capability
    )
    num_q_tiles = triton.cdiv(max_query_len, block_q)
    if num_splits is None:  # the interpreter runs programs one by one: no point splitting there
        num_splits = (
            1
            if query.device.type != "cuda"
            else default_num_splits(facts.num_sms, num_reqs * num_q_tiles * num_kv_heads, max_query_len, max_seq_len)
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
        query if sinks is None else sinks,  # never read without sinks
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
        USE_SINKS=sinks is not None,
        num_warps=num_warps,
    )
    if num_splits > 1:
        _combine_splits_kernel[(num_tokens, num_heads)](
            out,
            *partials,
            query_start_loc,
            query if sinks is None else sinks,
            num_reqs,
            num_tokens,
            num_heads,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            NUM_SPLITS=num_splits,
            USE_SINKS=sinks is not None,
        )
    return out
