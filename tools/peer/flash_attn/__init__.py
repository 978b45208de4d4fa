"""A stand-in for ``flash_attn`` that nano-vllm imports (``tools/nanovllm_peer.py`` puts this
folder first on its ``PYTHONPATH``): the two functions it calls, with the arguments it
passes, over minivllm's paged-attention Triton kernel. flash-attn cannot be installed on
the GPU machine; with this both engines run the same attention kernel, so the comparison
is of the engines.

- ``flash_attn_varlen_func``: prefill. Without ``block_table``, ``k``/``v`` are the new
  tokens (total_k, Hkv, D), stacked into a cache of one-token blocks whose block table is
  each sequence's token range; with it, ``k``/``v`` are the paged caches (num_blocks,
  block_size, Hkv, D) and each sequence's queries are the last of its ``cu_seqlens_k``
  tokens (flash-attn's bottom-right causal alignment).
- ``flash_attn_with_kvcache``: decode, one query per sequence (B, 1, H, D) over
  ``cache_seqlens`` tokens of the paged caches.

nano-vllm's caches are views ``kv[0, layer]`` and ``kv[1, layer]`` of one tensor, so the
keys and values are one strided (2, num_blocks, block_size, Hkv, D) view, the layout the
kernel reads, without a copy. Only causal attention with these arguments is served: any
other flash-attn option is an error.
"""

from __future__ import annotations

import math

import torch

from minivllm.attention.ops.triton_paged_attention import paged_attention

__version__ = "0.0.0+minivllm-shim"


def _given(value: object) -> bool:
    """An option set to something other than flash-attn's default (None, False, 0, (-1, -1))."""
    if value is None:
        return False
    return not (isinstance(value, (bool, int, float, tuple)) and value in (False, 0, (-1, -1)))


def _unsupported(name: str, causal: bool, extra: dict) -> None:
    if not causal:
        raise NotImplementedError(f"{name}: this flash_attn stand-in serves causal attention only")
    given = {k for k, v in extra.items() if _given(v)}
    if given:
        raise NotImplementedError(f"{name}: this flash_attn stand-in does not serve {sorted(given)}")


def paired_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """(2, num_blocks, block_size, Hkv, D): the two caches as one strided view where they share
    storage with values after keys and the same strides (nano-vllm's), else a stacked copy."""
    size = k_cache.element_size()
    delta, rest = divmod(v_cache.data_ptr() - k_cache.data_ptr(), size)
    shares = (
        k_cache.untyped_storage().data_ptr() == v_cache.untyped_storage().data_ptr()
        and delta > 0
        and rest == 0
        and v_cache.shape == k_cache.shape
        and v_cache.stride() == k_cache.stride()
        and v_cache.dtype == k_cache.dtype
    )
    if not shares:
        return torch.stack((k_cache, v_cache))
    return k_cache.as_strided((2, *k_cache.shape), (delta, *k_cache.stride()), k_cache.storage_offset())


def flash_attn_varlen_func(
    q: torch.Tensor,  # (total_q, H, D)
    k: torch.Tensor,  # (total_k, Hkv, D), or the key cache (num_blocks, block_size, Hkv, D)
    v: torch.Tensor,  # like k
    cu_seqlens_q: torch.Tensor,  # (B + 1,) int32
    cu_seqlens_k: torch.Tensor,  # (B + 1,) int32
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    block_table: torch.Tensor | None = None,  # (B, max_blocks) int32
    **extra,
) -> torch.Tensor:  # (total_q, H, D)
    """Causal attention of each sequence's queries over its keys (the last queries of the keys)."""
    _unsupported("flash_attn_varlen_func", causal, {"dropout_p": dropout_p, **extra})
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    seq_lens = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    if block_table is None:  # contiguous keys: blocks of one token, each sequence its range
        cache = torch.stack((k, v)).unsqueeze(2)  # (2, total_k, 1, Hkv, D)
        offsets = torch.arange(max_seqlen_k, device=k.device, dtype=torch.int32)
        block_table = (cu_seqlens_k[:-1, None] + offsets).clamp_(max=max(k.shape[0] - 1, 0)).to(torch.int32)
    else:
        cache = paired_cache(k, v)
    return paged_attention(
        q,
        cache,
        cu_seqlens_q.to(torch.int32),
        seq_lens,
        block_table.to(torch.int32),
        max_query_len=max_seqlen_q,
        max_seq_len=max_seqlen_k,
        scale=scale,
    )


def flash_attn_with_kvcache(
    q: torch.Tensor,  # (B, 1, H, D)
    k_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D)
    v_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D)
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | None = None,  # (B,) int32: tokens in the cache, the query's included
    block_table: torch.Tensor | None = None,  # (B, max_blocks) int32
    softmax_scale: float | None = None,
    causal: bool = False,
    **extra,
) -> torch.Tensor:  # (B, 1, H, D)
    """One new query per sequence over its ``cache_seqlens`` cached tokens (already written)."""
    _unsupported("flash_attn_with_kvcache", causal, {"k": k, "v": v, **extra})
    if cache_seqlens is None or block_table is None:
        raise NotImplementedError("flash_attn_with_kvcache: this stand-in needs cache_seqlens and block_table")
    if q.shape[1] != 1:
        raise NotImplementedError(f"flash_attn_with_kvcache: one query per sequence, got {q.shape[1]}")
    batch = q.shape[0]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    query_start_loc = torch.arange(batch + 1, device=q.device, dtype=torch.int32)
    out = paged_attention(
        q[:, 0],
        paired_cache(k_cache, v_cache),
        query_start_loc,
        cache_seqlens.to(torch.int32),
        block_table.to(torch.int32),
        max_query_len=1,
        max_seq_len=block_table.shape[1] * k_cache.shape[1],  # a bound: the graph's shapes never change
        scale=scale,
    )
    return out.unsqueeze(1)
