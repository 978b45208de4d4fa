"""Reference attention backend in plain torch, reading the paged KV cache.

Decode requests (one new token each) are batched into one masked SDPA call over
keys gathered through their block tables; prefill chunks run one request at a
time. This is the CPU default and the oracle the Triton kernels are tested
against.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.attention.backend import AttentionBackend, AttentionMetadata


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


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

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
        write_kv(key, value, kv_cache, meta.slot_mapping)
        out = torch.empty_like(query)
        opts = dict(scale=scale, sliding_window=sliding_window, soft_cap=logits_soft_cap)
        decode_idx = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
        if decode_idx:
            self._decode(query, kv_cache, meta, decode_idx, out, **opts)
        starts = meta.query_start_loc.tolist() if len(decode_idx) < meta.num_reqs else []
        for i, n in enumerate(meta.query_lens_cpu):
            if n > 1:
                self._prefill(query, kv_cache, meta, i, starts[i], n, out, **opts)
        return out

    def _decode(self, query, kv_cache, meta, idx, out, **opts) -> None:
        """One-token requests, batched by context length: one masked attention call per
        power-of-two number of blocks, so no context is padded to more than twice its
        length (one call for all would pad every request to the longest)."""
        groups: dict[int, list[int]] = {}
        for i in idx:
            num_blocks = -(-meta.seq_lens_cpu[i] // kv_cache.shape[2])
            groups.setdefault((num_blocks - 1).bit_length(), []).append(i)
        for rows in groups.values():
            self._decode_group(query, kv_cache, meta, rows, out, **opts)

    def _decode_group(self, query, kv_cache, meta, idx, out, *, scale, sliding_window, soft_cap) -> None:
        """These one-token requests in one masked attention call."""
        rows = torch.tensor(idx, device=query.device)
        token_idx = meta.query_start_loc[rows].long()  # each decode request's single token
        seq_lens = meta.seq_lens[rows].long()  # (B,)
        num_blocks = -(-max(meta.seq_lens_cpu[i] for i in idx) // kv_cache.shape[2])
        k, v = _gather_blocks(kv_cache, meta.block_tables[rows, :num_blocks])  # (B, Hkv, L, D), L padded to blocks
        q = query[token_idx].unsqueeze(2)  # (B, H, 1, D)
        key_pos = torch.arange(k.shape[2], device=query.device)
        mask = key_pos < seq_lens[:, None]  # (B, L)
        if sliding_window is not None:
            mask &= key_pos > (seq_lens[:, None] - 1 - sliding_window)
        o = _attend(q, k, v, mask[:, None, None, :], scale, soft_cap)  # (B, H, 1, D)
        out[token_idx] = o.squeeze(2).to(out.dtype)

    def _prefill(self, query, kv_cache, meta, i, start, n, out, *, scale, sliding_window, soft_cap) -> None:
        """One request's chunk of ``n`` queries, the last ``n`` of its ``seq_len`` positions."""
        seq_len = meta.seq_lens_cpu[i]
        slots = gather_slots(meta.block_tables[i : i + 1], seq_len, kv_cache.shape[2])
        k, v = _gather(kv_cache, slots)  # (1, Hkv, L, D)
        q = query[start : start + n].transpose(0, 1).unsqueeze(0)  # (1, H, n, D)
        q_pos = torch.arange(seq_len - n, seq_len, device=query.device)[:, None]
        k_pos = torch.arange(seq_len, device=query.device)[None, :]
        mask = k_pos <= q_pos  # (n, L)
        if sliding_window is not None:
            mask &= k_pos > q_pos - sliding_window
        o = _attend(q, k, v, mask[None, None], scale, soft_cap)  # (1, H, n, D)
        out[start : start + n] = o[0].transpose(0, 1).to(out.dtype)


def _gather_blocks(kv_cache: torch.Tensor, block_tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole blocks of (B, nb) tables -> keys and values as two (B, Hkv, nb * block_size, D) tensors.

    Copying contiguous blocks (block_size * Hkv * D elements each) is much cheaper on
    the CPU than gathering one slot at a time; positions past a request's length
    are garbage for the caller to mask."""
    B, nb = block_tables.shape
    _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    ids = block_tables.reshape(-1).long()
    k = kv_cache[0].index_select(0, ids).view(B, nb * block_size, num_kv_heads, head_dim)
    v = kv_cache[1].index_select(0, ids).view(B, nb * block_size, num_kv_heads, head_dim)
    return k.transpose(1, 2), v.transpose(1, 2)


def _gather(kv_cache: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values at (B, L) slots -> two (B, Hkv, L, D) tensors."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    flat = kv_cache.view(2, -1, num_kv_heads, head_dim)
    k = flat[0][slots].transpose(1, 2)
    v = flat[1][slots].transpose(1, 2)
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
