"""Reference attention backend in plain torch, reading the paged KV cache.

Keys and values are gathered a whole block at a time, both in one
``index_select`` over the cache viewed as one row per block (a contiguous copy
of ``block_size * Hkv * D`` elements, far cheaper on the CPU than slot by
slot); positions past a request's end are masked out by causality. Decode
requests (one new token each) are batched into one masked SDPA call per
power-of-two number of blocks, so no context is padded to more than twice its
length; prefill chunks run one request at a time. The groups, block ids and
masks depend only on the step, so ``prepare`` builds them once and every layer
reuses them (masks are additive float tensors, which SDPA adds as they are,
where a boolean one is converted in every call). Without a sliding window a
query's mask is a row of the causal mask, so a step's masks are rows looked up
in a table the backend keeps (``_CausalRows``), not comparisons redone every
step. This is the CPU default and the oracle the Triton kernels are tested against.

On the CPU with an fp32 cache, decode requests instead read the cache in place
through a small C kernel (``cpu_paged_decode.py``) when it builds: one
``PagedDecode`` entry stands for all of a step's decode tokens, and falls back to
the gathered groups above for a cache or query the kernel does not serve.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from minivllm.attention import cpu_paged_decode
from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.attention.kv_quant import dequantize_fp8, is_fp8, quantize_fp8
from minivllm.attention.mla import mla_attention
from minivllm.c_kernels import profiled


@dataclass
class _Group:
    """Queries that attend together: their token rows, the blocks to gather, the mask."""

    token_idx: torch.Tensor | slice
    """Rows of the flat batch (a slice for one prefill chunk)."""
    block_ids: torch.Tensor
    """(B, nb) int64 blocks holding each request's context, in order."""
    q_pos: torch.Tensor
    """(B, Q, 1) position of each query."""
    num_keys: int
    """Keys gathered per request, ``nb * block_size``: the key at index ``l`` is at position ``l``."""
    single_decode_len: int | None = None
    """For a group of one decode request: its length. Its keys are then cut to
    that length and attend unmasked, which lets SDPA take its fastest path."""

    biases: dict[tuple[int | None, torch.dtype], torch.Tensor] = field(default_factory=dict)
    """The additive masks built so far this step, by (sliding window, dtype)."""

    def bias(self, window: int | None, dtype: torch.dtype, causal_rows: "_CausalRows") -> torch.Tensor:
        """(B, 1, Q, L) additive mask: 0 where a key is at or before its query (and within
        ``window`` of it), -inf elsewhere (which also drops the gathered positions past the
        request's end). Built once per step and window, when the first layer needs it (a
        single decode request without a window never does); every later layer adds it
        as it is, where a boolean mask would be turned into this one in every layer.
        Without a window the rows come from the backend's ``causal_rows`` where it holds them."""
        key = (window, dtype)
        if key not in self.biases:
            mask = causal_rows.lookup(self.q_pos, self.num_keys, dtype) if window is None else None
            self.biases[key] = mask if mask is not None else self._compared(window, dtype)
        return self.biases[key]

    def _compared(self, window: int | None, dtype: torch.dtype) -> torch.Tensor:
        """``bias`` from comparing the positions of queries and keys."""
        k_pos = torch.arange(self.num_keys, device=self.q_pos.device).view(1, 1, -1)
        hidden = k_pos > self.q_pos  # (B, Q, L)
        if window is not None:
            hidden |= k_pos <= self.q_pos - window
        zeros = torch.zeros(hidden.shape, dtype=dtype, device=hidden.device)
        return zeros.masked_fill_(hidden, float("-inf")).unsqueeze(1)


class _CausalRows:
    """Rows of the additive causal mask, kept across steps: row ``p`` is the mask of a
    query at position ``p`` over keys ``0 .. L-1`` (0 up to ``p``, -inf after), so
    a group's mask is one row lookup per query. One square table per dtype and
    device, grown by doubling to the longest key range asked for, up to
    ``max_len`` keys (4 MiB in fp32); longer ranges are left to the caller."""

    def __init__(self, max_len: int = 1024) -> None:
        self.max_len = max_len
        self._tables: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}

    def lookup(self, q_pos: torch.Tensor, num_keys: int, dtype: torch.dtype) -> torch.Tensor | None:
        """q_pos: (B, Q, 1) positions below ``num_keys`` -> (B, 1, Q, num_keys) mask, or
        None when ``num_keys`` is past ``max_len``."""
        if num_keys > self.max_len:
            return None
        key = (dtype, q_pos.device)
        table = self._tables.get(key)
        if table is None or len(table) < num_keys:
            size = min(max(num_keys, 2 * len(table) if table is not None else 64), self.max_len)
            table = torch.full((size, size), float("-inf"), dtype=dtype, device=q_pos.device).triu_(1)
            self._tables[key] = table
        B, Q, _ = q_pos.shape
        return table[:, :num_keys].index_select(0, q_pos.view(-1)).view(B, 1, Q, num_keys)


class PagedDecode:
    """A step's decode tokens for the in-place CPU kernel: each request's query row,
    block table and length, with the gathered groups built only if a layer needs them."""

    def __init__(self, host: "_HostIndex", decode: np.ndarray, block_size: int) -> None:
        seq_lens = host.seq_lens[decode]
        num_blocks = -(-int(seq_lens.max()) // block_size)
        self.rows = torch.from_numpy(host.query_start[decode].astype(np.int64))  # (B,)
        self.block_tables = torch.from_numpy(np.ascontiguousarray(host.block_tables[decode, :num_blocks], np.int32))
        self.seq_lens = torch.from_numpy(seq_lens.astype(np.int32))  # (B,)
        self._fallback = (host, decode, block_size)
        self._groups: list[_Group] | None = None

    def groups(self) -> list[_Group]:
        """The same tokens as block-gather groups (for a cache the kernel does not serve)."""
        if self._groups is None:
            self._groups = _decode_groups(*self._fallback, self.rows.device)
        return self._groups


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def __init__(self) -> None:
        self.causal_rows = _CausalRows()

    def prepare(self, meta: AttentionMetadata, block_size: int) -> list[_Group | PagedDecode]:
        query_lens = np.asarray(meta.query_lens_cpu)  # (B,)
        seq_lens = np.asarray(meta.seq_lens_cpu)  # (B,)
        decode = np.flatnonzero(query_lens == 1)
        groups: list[_Group | PagedDecode] = []
        if len(decode):
            host = _HostIndex(meta, seq_lens)
            if meta.seq_lens.device.type == "cpu" and cpu_paged_decode.load() is not None:
                groups.append(PagedDecode(host, decode, block_size))
            else:
                groups += _decode_groups(host, decode, block_size, meta.seq_lens.device)
        if len(decode) < len(query_lens):
            starts = meta.query_start_loc.tolist()
            groups += [
                _prefill_group(meta, i, starts[i], int(query_lens[i]), block_size)
                for i in np.flatnonzero(query_lens > 1).tolist()
            ]
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
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        sinks: torch.Tensor | None = None,
        kv_written: bool = False,
    ) -> torch.Tensor:
        """``kv_written``: the layer already stored the step's keys and values (``Attention.prepare_qkv_``)."""
        if meta.backend_data is None:  # a caller that skipped prepare()
            meta.backend_data = self.prepare(meta, kv_cache.shape[2])
        if not kv_written:
            write_kv(key, value, kv_cache, meta.slot_mapping, k_scale, v_scale, meta.has_padding)
        groups = meta.backend_data
        if any(isinstance(g, PagedDecode) for g in groups):
            groups = self._paged_decode(groups, query, kv_cache, scale, sliding_window, logits_soft_cap, sinks)
            out = groups.pop()  # the decode rows, written; the prefill groups write theirs below
        else:
            out = None if _is_whole_batch(groups, len(query)) else torch.empty_like(query)
        for group in groups:
            B = group.block_ids.shape[0]
            q = query[group.token_idx].view(B, -1, *query.shape[1:]).transpose(1, 2)  # (B, H, Q, D)
            k, v = _gather_blocks(kv_cache, group.block_ids)  # (B, Hkv, L, D)
            if is_fp8(kv_cache):
                k, v = dequantize_fp8(k, k_scale, query.dtype), dequantize_fp8(v, v_scale, query.dtype)
            if group.single_decode_len is not None and sliding_window is None:
                n = group.single_decode_len
                k, v, mask = k[:, :, :n], v[:, :, :n], None
            else:
                mask = group.bias(sliding_window, q.dtype, self.causal_rows)
            o = _attend(q, k, v, mask, scale, logits_soft_cap, sinks).transpose(1, 2)  # (B, Q, H, D)
            if out is None:
                return o.reshape(query.shape)
            out[group.token_idx] = o.reshape(-1, *query.shape[1:]).to(out.dtype)
        return out

    def forward_mla(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        latent: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        *,
        w_uk: torch.Tensor,
        w_uv: torch.Tensor,
        scale: float,
        k_scale: float = 1.0,
    ) -> torch.Tensor:
        """MLA in torch (``attention/mla.py``): decode absorbed, prefill chunks expanded."""
        return mla_attention(q_nope, q_pe, latent, kv_cache, meta, w_uk=w_uk, w_uv=w_uv, scale=scale, k_scale=k_scale)

    @staticmethod
    def _paged_decode(groups, query, kv_cache, scale, sliding_window, soft_cap, sinks) -> list:
        """Run the in-place kernel for the ``PagedDecode`` entry (or expand it into gather
        groups where the kernel does not serve these tensors, or attention sinks, which it does
        not apply): the groups left to run, and last, the output tensor."""
        lib = cpu_paged_decode.load()
        rest: list = []
        out = torch.empty_like(query)
        for g in groups:
            if not isinstance(g, PagedDecode):
                rest.append(g)
            elif sinks is None and cpu_paged_decode.supports(query, kv_cache):
                with profiled("cpu_paged_decode_attention"):  # named for profiles
                    cpu_paged_decode.paged_decode(
                        lib, query, kv_cache, out, g.block_tables, g.seq_lens, g.rows, scale, sliding_window, soft_cap
                    )
            else:
                rest += g.groups()
        return rest + [out]


def _is_whole_batch(groups: list[_Group], num_tokens: int) -> bool:
    """One group of every token, in order: its output is the layer's, with nothing to copy."""
    if len(groups) != 1 or not isinstance(groups[0].token_idx, slice):
        return False
    return groups[0].token_idx.start == 0 and groups[0].token_idx.stop == num_tokens


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    has_padding: bool | None = None,
) -> None:
    """Store (T, Hkv, D) keys/values at their slots; negative slots (padding) are skipped.
    An fp8 cache stores ``key / k_scale`` and ``value / v_scale``. ``has_padding`` says
    whether any slot is negative (None: unknown, so the slots are read, a host sync on CUDA)."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    if has_padding is None:
        has_padding = bool((slot_mapping < 0).any())
    if has_padding:
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    if is_fp8(kv_cache):  # CPU torch has no fp8 index_copy_: copy the bytes
        kv_cache = kv_cache.view(torch.uint8)
        key, value = quantize_fp8(key, k_scale).view(torch.uint8), quantize_fp8(value, v_scale).view(torch.uint8)
    k_flat = kv_cache[0].view(-1, num_kv_heads, head_dim)  # (num_blocks * block_size, Hkv, D)
    v_flat = kv_cache[1].view(-1, num_kv_heads, head_dim)
    if key.dtype != kv_cache.dtype:
        key, value = key.to(kv_cache.dtype), value.to(kv_cache.dtype)
    k_flat.index_copy_(0, slot_mapping, key)
    v_flat.index_copy_(0, slot_mapping, value)


class _HostIndex:
    """A step's per-request arrays on the host, where indexing a few rows costs a
    microsecond (advanced indexing of a tensor costs tens)."""

    def __init__(self, meta: AttentionMetadata, seq_lens: np.ndarray) -> None:
        self.seq_lens = seq_lens  # (B,)
        self.query_start = meta.query_start_loc_cpu  # (B + 1,)
        if self.query_start is None:  # metadata built without host copies
            self.query_start = meta.query_start_loc.cpu().numpy()
        self.block_tables = meta.block_tables_cpu  # (B, W)
        if self.block_tables is None:
            self.block_tables = meta.block_tables.cpu().numpy()


def _decode_groups(host: _HostIndex, decode: np.ndarray, block_size: int, device: torch.device) -> list[_Group]:
    """Decode requests ``decode`` batched into one group per power-of-two number of blocks."""
    num_blocks = -(-host.seq_lens[decode] // block_size)
    _, size_class = np.frexp(num_blocks - 1)  # (num_blocks - 1).bit_length(), vectorized
    classes = np.unique(size_class)
    return [
        _decode_group(host, decode if len(classes) == 1 else decode[size_class == c], block_size, device)
        for c in classes
    ]


def _decode_group(host: _HostIndex, rows: np.ndarray, block_size: int, device: torch.device) -> _Group:
    """Decode requests ``rows`` (indices into the step's requests, ascending)."""
    seq_lens = host.seq_lens[rows]
    num_blocks = -(-int(seq_lens.max()) // block_size)
    tokens = host.query_start[rows]
    token_idx: torch.Tensor | slice = slice(int(tokens[0]), int(tokens[-1]) + 1)
    if tokens[-1] - tokens[0] != len(rows) - 1:  # not one run of the flat batch
        token_idx = torch.from_numpy(tokens.astype(np.int64)).to(device)
    return _Group(
        token_idx=token_idx,  # each request's single token
        block_ids=torch.from_numpy(host.block_tables[rows, :num_blocks].astype(np.int64)).to(device),
        q_pos=torch.from_numpy((seq_lens - 1).astype(np.int64)).to(device).view(-1, 1, 1),
        num_keys=num_blocks * block_size,
        single_decode_len=int(seq_lens[0]) if len(rows) == 1 else None,
    )


def _prefill_group(meta: AttentionMetadata, i: int, start: int, n: int, block_size: int) -> _Group:
    """One request's chunk of ``n`` queries, the last ``n`` of its ``seq_len`` positions."""
    seq_len = int(meta.seq_lens_cpu[i])
    num_blocks = -(-seq_len // block_size)
    device = meta.seq_lens.device
    return _Group(
        token_idx=slice(start, start + n),
        block_ids=meta.block_tables[i : i + 1, :num_blocks].long(),
        q_pos=torch.arange(seq_len - n, seq_len, device=device).view(1, -1, 1),
        num_keys=num_blocks * block_size,
    )


def _gather_blocks(kv_cache: torch.Tensor, block_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole blocks of (B, nb) tables -> keys and values as two (B, Hkv, nb * block_size, D) tensors."""
    B, nb = block_ids.shape
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    blocks = kv_cache.view(2, num_blocks, -1)  # (2, num_blocks, block_size * Hkv * D): one row per block
    kv = blocks.index_select(1, block_ids.reshape(-1)).view(2, B, nb * block_size, num_kv_heads, head_dim)
    return kv[0].transpose(1, 2), kv[1].transpose(1, 2)


def _attend(q, k, v, mask, scale: float, soft_cap: float | None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q: (B, H, Q, D); k, v: (B, Hkv, L, D); mask: (B, 1, Q, L) additive, 0 = attend, -inf = not
    (None: every key, the last query's causal context when Q == 1); sinks: (H,) logits that join
    each softmax's denominator (gpt-oss), None for none."""
    B, H, Q, D = q.shape
    group = H // k.shape[1]
    if k.dtype != q.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)
    if group > 1 and Q == 1:
        # Decode: the heads sharing a KV head become that head's queries, so keys and
        # values are read as they are, never repeated (the mask is the same for them).
        o = _attend(q.view(B, k.shape[1], group, D), k, v, mask, scale, soft_cap, sinks)  # (B, Hkv, group, D)
        return o.reshape(B, H, 1, D)
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    if soft_cap is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if soft_cap is not None:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    if mask is not None:
        scores = scores + mask
    if sinks is not None:  # one more column per row: the sink's logit, dropped after the softmax
        sink = sinks.float().view(1, -1, 1, 1).reshape(1, scores.shape[1], -1, 1)  # (1, H', Q' or 1, 1)
        sink = sink.expand(*scores.shape[:-1], 1)
        return torch.matmul(torch.cat([scores, sink], -1).softmax(dim=-1)[..., :-1], v.float()).to(q.dtype)
    return torch.matmul(scores.softmax(dim=-1), v.float()).to(q.dtype)
