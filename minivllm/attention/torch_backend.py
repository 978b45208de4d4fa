"""Reference attention backend in plain torch, reading the paged KV cache.

Decode requests (one new token each) are batched into one masked SDPA call over
keys gathered through their block tables; prefill chunks run one request at a
time. The gather indices and masks depend only on the step, so ``prepare``
builds them once and every layer reuses them. This is the CPU default and the
oracle the Triton kernels are tested against.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minivllm.attention.backend import AttentionBackend, AttentionMetadata


@dataclass
class _Group:
    """Queries that attend together: their token rows, key slots and mask."""

    token_idx: torch.Tensor | slice
    """Rows of the flat batch (a slice for one prefill chunk)."""
    slots: torch.Tensor
    """(B, L) cache slots of the keys to gather."""
    positions: tuple[torch.Tensor, torch.Tensor]
    """(query positions (B, Q, 1), key positions (1, 1, L)) for causal/window masks."""
    valid: torch.Tensor
    """(B, Q, L) True where a key is inside the causal context."""


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def prepare(self, meta: AttentionMetadata, block_size: int) -> list[_Group]:
        groups = []
        decode_rows = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
        if decode_rows:
            groups.append(_decode_group(meta, decode_rows, block_size))
        starts = meta.query_start_loc.tolist() if len(decode_rows) < meta.num_reqs else []
        for i, n in enumerate(meta.query_lens_cpu):
            if n > 1:
                groups.append(_prefill_group(meta, i, starts[i], n, block_size))
        return groups

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        *,
        scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ) -> torch.Tensor:
        if meta.backend_data is None:  # a caller that skipped prepare()
            meta.backend_data = self.prepare(meta, kv_cache.shape[2])
        write_kv(key, value, kv_cache, meta.slot_mapping)
        out = torch.empty_like(query)
        for group in meta.backend_data:
            q = query[group.token_idx]  # (B*Q, H, D) rows of this group
            B, L = group.slots.shape
            q = q.view(B, -1, *q.shape[1:]).transpose(1, 2)  # (B, H, Q, D)
            k, v = _gather(kv_cache, group.slots)  # (B, Hkv, L, D)
            mask = group.valid
            if sliding_window is not None:
                q_pos, k_pos = group.positions
                mask = mask & (k_pos > q_pos - sliding_window)
            o = _attend(q, k, v, mask.unsqueeze(1), scale, logits_soft_cap)  # (B, H, Q, D)
            out[group.token_idx] = o.transpose(1, 2).reshape(-1, *o.shape[1:2], o.shape[-1]).to(out.dtype)
        return out


def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store (T, Hkv, D) keys/values at their slots; negative slots (padding) are skipped."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    k_flat = kv_cache[0].view(-1, num_kv_heads, head_dim)  # (num_blocks * block_size, Hkv, D)
    v_flat = kv_cache[1].view(-1, num_kv_heads, head_dim)
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    k_flat.index_copy_(0, slot_mapping, key.to(kv_cache.dtype))
    v_flat.index_copy_(0, slot_mapping, value.to(kv_cache.dtype))


def gather_slots(block_tables: torch.Tensor, max_len: int, block_size: int) -> torch.Tensor:
    """(B, max_blocks) block tables -> (B, max_len) cache slots of positions 0..max_len-1."""
    pos = torch.arange(max_len, device=block_tables.device)
    blocks = block_tables[:, pos // block_size].long()  # (B, max_len)
    return blocks * block_size + pos % block_size


def _decode_group(meta: AttentionMetadata, rows: list[int], block_size: int) -> _Group:
    rows_t = torch.tensor(rows, device=meta.seq_lens.device)
    seq_lens = meta.seq_lens[rows_t].long()  # (B,)
    max_len = max(meta.seq_lens_cpu[i] for i in rows)
    k_pos = torch.arange(max_len, device=seq_lens.device).view(1, 1, -1)
    q_pos = (seq_lens - 1).view(-1, 1, 1)
    return _Group(
        token_idx=meta.query_start_loc[rows_t].long(),
        slots=gather_slots(meta.block_tables[rows_t], max_len, block_size),
        positions=(q_pos, k_pos),
        valid=k_pos <= q_pos,
    )


def _prefill_group(meta: AttentionMetadata, i: int, start: int, n: int, block_size: int) -> _Group:
    seq_len = meta.seq_lens_cpu[i]
    device = meta.seq_lens.device
    q_pos = torch.arange(seq_len - n, seq_len, device=device).view(1, -1, 1)
    k_pos = torch.arange(seq_len, device=device).view(1, 1, -1)
    return _Group(
        token_idx=slice(start, start + n),
        slots=gather_slots(meta.block_tables[i : i + 1], seq_len, block_size),
        positions=(q_pos, k_pos),
        valid=k_pos <= q_pos,
    )


def _gather(kv_cache: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values at (B, L) slots -> two (B, Hkv, L, D) tensors."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    flat = kv_cache.view(2, -1, num_kv_heads * head_dim)
    index = slots.reshape(-1)
    shape = (*slots.shape, num_kv_heads, head_dim)
    k = flat[0].index_select(0, index).view(shape).transpose(1, 2)
    v = flat[1].index_select(0, index).view(shape).transpose(1, 2)
    return k, v


def _attend(q, k, v, mask, scale: float, soft_cap: float | None) -> torch.Tensor:
    """q: (B, H, Q, D); k, v: (B, Hkv, L, D); mask: broadcastable to (B, H, Q, L), True = attend."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    k, v = k.to(q.dtype), v.to(q.dtype)
    if soft_cap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    scores = soft_cap * torch.tanh(scores / soft_cap)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1), v.float()).to(q.dtype)
