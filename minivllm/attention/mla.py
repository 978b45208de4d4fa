"""Multi-head Latent Attention (DeepSeek V2/V3) over a paged latent cache, in torch.

The cache of one MLA layer holds, per token, what every head's key and value are
made from: the normalized compressed KV ``c`` (``kv_lora_rank`` = r values) and the
rotated shared rope key ``k_pe`` (``qk_rope_head_dim`` = dr values)::

    kv_cache: (num_blocks, block_size, 1, r + dr)      one latent "head" per token
                                    [ c (r) | k_pe (dr) ]

``kv_b_proj`` (H * (dn + dv), r) splits per head h into ``W_UK[h]`` (dn, r) and
``W_UV[h]`` (dv, r); head h's key is ``[W_UK[h] c ; k_pe]`` and its value ``W_UV[h] c``.
Two ways to attend, equal in exact arithmetic:

* expanded (prefill chunks): the gathered latents are turned into per-head keys
  (dn + dr) and values (dv), then ordinary attention. Costs H * (dn + dr + dv)
  per context token, paid once for many queries.
* absorbed (decode): each query is moved into the latent space,
  ``q_lat[h] = W_UK[h]^T q_nope[h]`` (r), and attends to the latents themselves
  as one key of width r + dr (``[q_lat ; q_pe] . [c ; k_pe]``) whose first r
  features are also the value; the latent output goes back through ``W_UV[h]``.
  Every query head shares the one latent head (MQA with K width r + dr, V width r),
  so a decode step reads r + dr values per context token instead of H * (dn + dr + dv).

An fp8 cache stores ``latent / k_scale`` (one scale for the layer's latent).

The expanded form never holds a whole context expanded: a prefill chunk attends to its
own new tokens (causal) and to its earlier context (cached blocks, earlier chunks) in
pieces of at most ``CONTEXT_CHUNK_TOKENS`` positions, all of them visible; each piece
gives a partial output and its log-sum-exp, and ``merge_partials`` combines them into
the softmax over the whole context. The expanded working set is so bounded by the step's
new tokens and one piece (``context_workspace_bytes``: the start-up profile reserves it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from minivllm.attention.backend import AttentionMetadata
from minivllm.attention.kv_quant import dequantize_fp8, is_fp8, quantize_fp8

CONTEXT_CHUNK_TOKENS = 8192
"""Most context positions one piece of the expanded form expands (per step, all prefill requests together)."""


def context_workspace_bytes(num_heads: int, nope_dim: int, v_dim: int, latent_dim: int, dtype: torch.dtype) -> int:
    """Bytes one context piece holds expanded: its latents (r + dr), keys (H * dn) and values (H * dv)."""
    return CONTEXT_CHUNK_TOKENS * (latent_dim + num_heads * (nope_dim + v_dim)) * dtype.itemsize


def merge_partials(
    out: torch.Tensor | None,  # (..., dv) fp32 the running output, or None
    lse: torch.Tensor | None,  # (...) fp32 its log-sum-exp
    part: torch.Tensor,  # (..., dv) one partial attention over other keys
    part_lse: torch.Tensor,  # (...) fp32 its log-sum-exp (-inf: no key)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the union of two disjoint key sets from each's output and log-sum-exp:
    ``softmax`` weights rescaled by ``exp(lse_i - lse)``. Rows with no key in either stay 0."""
    if out is None:
        return part.float(), part_lse
    total = torch.logaddexp(lse, part_lse)  # (...)
    safe = torch.where(total == float("-inf"), 0.0, total)
    merged = out * torch.exp(lse - safe).unsqueeze(-1) + part.float() * torch.exp(part_lse - safe).unsqueeze(-1)
    return merged, total


def write_latent(
    latent: torch.Tensor,  # (T, r + dr)
    kv_cache: torch.Tensor,  # (num_blocks, block_size, 1, r + dr)
    slot_mapping: torch.Tensor,  # (T,)
    k_scale: float = 1.0,
    has_padding: bool | None = None,
) -> None:
    """Store each new token's latent at its slot; negative slots (padding) are skipped."""
    width = kv_cache.shape[-1]
    if has_padding is None:
        has_padding = bool((slot_mapping < 0).any())
    if has_padding:
        keep = slot_mapping >= 0
        latent, slot_mapping = latent[keep], slot_mapping[keep]
    if is_fp8(kv_cache):  # CPU torch has no fp8 index_copy_: copy the bytes
        kv_cache, latent = kv_cache.view(torch.uint8), quantize_fp8(latent, k_scale).view(torch.uint8)
    flat = kv_cache.view(-1, width)  # (num_blocks * block_size, r + dr)
    flat.index_copy_(0, slot_mapping, latent.to(flat.dtype))


def gather_latent(kv_cache: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype, k_scale: float = 1.0):
    """(B, nb) block tables -> (B, nb * block_size, r + dr) latents in ``dtype``; index l is position l."""
    B, nb = block_ids.shape
    num_blocks, block_size, _, width = kv_cache.shape
    rows = kv_cache.view(num_blocks, -1).index_select(0, block_ids.reshape(-1))  # one row per block
    latent = rows.view(B, nb * block_size, width)
    return dequantize_fp8(latent, k_scale, dtype) if is_fp8(kv_cache) else latent.to(dtype)


def mla_attention(
    q_nope: torch.Tensor,  # (T, H, dn)
    q_pe: torch.Tensor,  # (T, H, dr), rotated
    latent: torch.Tensor,  # (T, r + dr): the new tokens' [c ; k_pe], k_pe rotated
    kv_cache: torch.Tensor,  # (num_blocks, block_size, 1, r + dr)
    meta: AttentionMetadata,
    *,
    w_uk: torch.Tensor,  # (H, dn, r)
    w_uv: torch.Tensor,  # (H, dv, r)
    scale: float,
    k_scale: float = 1.0,
    absorb: bool | None = None,
) -> torch.Tensor:  # (T, H, dv)
    """Store the new latents, then attend: decode requests (one new token) in the absorbed
    form, batched; prefill chunks one request at a time in the expanded form. ``absorb``
    forces one form for every request (tests compare the two)."""
    write_latent(latent, kv_cache, meta.slot_mapping, k_scale, meta.has_padding)
    plan = meta.mla_plan if absorb is None else None
    if plan is None:
        plan = MLAPlan.build(meta, kv_cache.shape[1], q_nope.device, absorb)
        if absorb is None:  # the same for every layer of the step
            meta.mla_plan = plan
    T, H, _ = q_nope.shape
    out = q_nope.new_zeros(T, H, w_uv.shape[1])  # padding rows stay zero
    if plan.decode_tokens is not None:  # decode: one query per request, all requests at once
        tokens = plan.decode_tokens
        lat = gather_latent(kv_cache, plan.decode_blocks, q_nope.dtype, k_scale)  # (B, L, r + dr)
        qn, qp = q_nope[tokens].unsqueeze(1), q_pe[tokens].unsqueeze(1)
        out[tokens] = _absorbed(qn, qp, lat, plan.decode_q_pos, w_uk, w_uv, scale).squeeze(1)
    form = _absorbed if absorb else _expanded_in_pieces
    for start, n, blocks, q_pos in plan.chunks:
        lat = gather_latent(kv_cache, blocks, q_nope.dtype, k_scale)  # (1, nb * block_size, r + dr)
        qn, qp = q_nope[start : start + n].unsqueeze(0), q_pe[start : start + n].unsqueeze(0)
        out[start : start + n] = form(qn, qp, lat, q_pos, w_uk, w_uv, scale).squeeze(0)
    return out


@dataclass
class MLAPlan:
    """What a step's MLA layers index with, built once per step (on the host, uploaded once).
    The torch path loops over prefill ``chunks``; a ``varlen`` plan (the Triton backend) instead
    takes every prefill request's rows at once: its decode requests by ``decode_reqs``, its
    prefill requests' new latents by ``prefill_new_slots`` (cut by ``prefill_cu_q``) and their
    earlier context's by ``prefill_ctx_slots``, in ``prefill_pieces`` of ``CONTEXT_CHUNK_TOKENS``."""

    decode_tokens: torch.Tensor | None
    """(B,) int64 rows of the decode requests' tokens in the flat batch; None: no decode request."""
    decode_blocks: torch.Tensor | None
    """(B, nb) int64 their block tables, cut to the longest one's blocks (torch path)."""
    decode_q_pos: torch.Tensor | None
    """(B, 1) int64 their queries' positions (torch path)."""
    chunks: list[tuple[int, int, torch.Tensor, torch.Tensor]]
    """Per prefill chunk: first token row, query count, (1, nb) block ids, (1, n) query positions (torch path)."""
    varlen: bool = False
    """Built for the Triton backend: the fields below instead of ``decode_blocks``/``q_pos``/``chunks``."""
    decode_reqs: torch.Tensor | None = None
    """(B,) int64 the decode requests' rows of the step's block tables and lengths."""
    prefill_tokens: torch.Tensor | None = None
    """(Tq,) int64 rows of the prefill requests' tokens (several queries each), request after request;
    None: no prefill request."""
    prefill_new_slots: torch.Tensor | None = None
    """(Tq,) int64 cache slots of the prefill requests' new tokens, request after request."""
    prefill_ctx_slots: torch.Tensor | None = None
    """(Lc,) int64 cache slots of their earlier context (positions before the new tokens), request after request."""
    prefill_pieces: tuple[tuple[int, int, torch.Tensor], ...] = ()
    """``prefill_ctx_slots`` cut every ``CONTEXT_CHUNK_TOKENS``: (first, end, (P + 1,) int32 prefix sums of
    each request's context positions in ``[first, end)``); empty: no earlier context."""
    prefill_cu_q: torch.Tensor | None = None
    """(P + 1,) int32 prefix sums of the prefill requests' query counts."""
    prefill_lens: tuple[tuple[int, int], ...] = ()
    """Per prefill request (query count, context length), on the host."""
    prefill_max_q: int = 0
    """The most queries of one prefill request."""

    @classmethod
    def build(
        cls, meta: AttentionMetadata, block_size: int, device: torch.device, absorb: bool | None, varlen: bool = False
    ) -> MLAPlan:
        query_lens = np.asarray(meta.query_lens_cpu)  # (B,)
        seq_lens = np.asarray(meta.seq_lens_cpu)  # (B,)
        starts = meta.query_start_loc_cpu
        if starts is None:
            starts = meta.query_start_loc.cpu().numpy()
        starts = np.asarray(starts)
        tables = meta.block_tables_cpu if meta.block_tables_cpu is not None else meta.block_tables.cpu().numpy()
        batched = query_lens == 1 if absorb is None else np.zeros(len(query_lens), dtype=bool)
        rows = np.flatnonzero(batched)
        prefill = np.flatnonzero(~batched)
        if varlen:
            return cls._build_varlen(rows, prefill, query_lens, seq_lens, starts, tables, block_size, device)
        decode = (None, None, None)
        if len(rows):
            nb = -(-int(seq_lens[rows].max()) // block_size)
            decode = (
                torch.from_numpy(starts[rows].astype(np.int64)).to(device),
                torch.from_numpy(tables[rows, :nb].astype(np.int64)).to(device),
                torch.from_numpy((seq_lens[rows] - 1).astype(np.int64)).to(device).view(-1, 1),
            )
        chunks = []
        for i in prefill.tolist():
            n, seq_len = int(query_lens[i]), int(seq_lens[i])
            blocks = torch.from_numpy(tables[i : i + 1, : -(-seq_len // block_size)].astype(np.int64)).to(device)
            chunks.append((int(starts[i]), n, blocks, torch.arange(seq_len - n, seq_len, device=device).view(1, n)))
        return cls(*decode, chunks)

    @classmethod
    def _build_varlen(cls, rows, prefill, query_lens, seq_lens, starts, tables, block_size, device) -> MLAPlan:
        """``rows``: the decode requests, ``prefill``: the others (numpy indices into the step's requests)."""

        def upload(array: np.ndarray, dtype=np.int64) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array, dtype=dtype)).to(device)

        plan = cls(None, None, None, [], varlen=True)
        if len(rows):
            plan.decode_tokens, plan.decode_reqs = upload(starts[rows]), upload(rows)
        if len(prefill):
            n, lens = query_lens[prefill], seq_lens[prefill]
            plan.prefill_tokens = upload(
                np.concatenate([np.arange(starts[i], starts[i] + q) for i, q in zip(prefill, n)])
            )

            def slots(first: np.ndarray, end: np.ndarray) -> np.ndarray:  # positions [first, end) of each request
                pos = np.concatenate([np.arange(a, b) for a, b in zip(first, end)])
                req = np.repeat(prefill, end - first)
                return tables[req, pos // block_size].astype(np.int64) * block_size + pos % block_size

            context = lens - n  # (P,) earlier positions of each request
            plan.prefill_new_slots = upload(slots(context, lens))
            plan.prefill_cu_q = upload(np.concatenate([[0], np.cumsum(n)]), np.int32)
            total = int(context.sum())
            if total:
                plan.prefill_ctx_slots = upload(slots(np.zeros_like(context), context))
                cu = np.concatenate([[0], np.cumsum(context)])  # (P + 1,)
                firsts = np.arange(0, total, CONTEXT_CHUNK_TOKENS)
                ends = np.minimum(firsts + CONTEXT_CHUNK_TOKENS, total)
                cu_k = upload(np.clip(cu[None, :], firsts[:, None], ends[:, None]) - firsts[:, None], np.int32)
                plan.prefill_pieces = tuple(zip(firsts.tolist(), ends.tolist(), cu_k))  # (pieces, P + 1) rows
            plan.prefill_lens = tuple(zip(n.tolist(), lens.tolist()))
            plan.prefill_max_q = int(n.max())
        return plan


def expand_context(
    kv_cache: torch.Tensor,  # (num_blocks, block_size, 1, r + dr)
    slots: torch.Tensor,  # (L,) int64
    w_uk: torch.Tensor,  # (H, dn, r)
    w_uv: torch.Tensor,  # (H, dv, r)
    dtype: torch.dtype,
    k_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The latents at ``slots`` expanded: per-head keys' first part k_nope (L, H, dn), the rope
    part k_pe (L, dr) every head shares (not copied per head), values (L, H, dv)."""
    width, r = kv_cache.shape[-1], w_uk.shape[-1]
    lat = kv_cache.view(-1, width).index_select(0, slots)  # (L, r + dr)
    lat = dequantize_fp8(lat, k_scale, dtype) if is_fp8(kv_cache) else lat.to(dtype)
    c = lat[:, :r]
    k_nope = torch.einsum("lr,hdr->lhd", c, w_uk)  # (L, H, dn)
    v = torch.einsum("lr,hvr->lhv", c, w_uv)  # (L, H, dv)
    return k_nope, lat[:, r:].contiguous(), v


def varlen_attention(
    q_nope: torch.Tensor,  # (Tq, H, dn)
    q_pe: torch.Tensor,  # (Tq, H, dr)
    k_nope: torch.Tensor,  # (Lk, H, dn)
    k_pe: torch.Tensor,  # (Lk, dr)
    v: torch.Tensor,  # (Lk, H, dv)
    lens: tuple[tuple[int, int], ...],
    scale: float,
) -> torch.Tensor:  # (Tq, H, dv)
    """Causal attention of request after request: ``lens[i] = (n, L)``, its n queries the last n of
    its L keys (``[k_nope ; k_pe]``). The torch reference of ``ops/triton_mla_prefill.py``."""
    H = q_nope.shape[1]
    q = torch.cat((q_nope, q_pe), dim=-1)
    k = torch.cat((k_nope, k_pe.unsqueeze(1).expand(-1, H, -1)), dim=-1)
    out, q0, k0 = [], 0, 0
    for n, length in lens:
        qi, ki, vi = (t.transpose(0, 1) for t in (q[q0 : q0 + n], k[k0 : k0 + length], v[k0 : k0 + length]))
        q_pos = torch.arange(length - n, length, device=q.device).view(1, n)
        mask = _bias(q_pos, length, q.dtype)[0]  # (1, n, L)
        out.append(F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale).transpose(0, 1))
        q0, k0 = q0 + n, k0 + length
    return torch.cat(out)


def _bias(q_pos: torch.Tensor, num_keys: int, dtype: torch.dtype) -> torch.Tensor:
    """q_pos (B, Q) -> (B, 1, Q, L) additive causal mask (it also hides gathered slots past the end)."""
    k_pos = torch.arange(num_keys, device=q_pos.device).view(1, 1, -1)
    hidden = k_pos > q_pos.unsqueeze(-1)  # (B, Q, L)
    return torch.zeros(hidden.shape, dtype=dtype, device=q_pos.device).masked_fill_(hidden, float("-inf")).unsqueeze(1)


def _absorbed(q_nope, q_pe, lat, q_pos, w_uk, w_uv, scale: float) -> torch.Tensor:
    """q_nope (B, Q, H, dn), q_pe (B, Q, H, dr), lat (B, L, r + dr), q_pos (B, Q) -> (B, Q, H, dv).
    Attention over the latents themselves: one shared key/value head."""
    r = w_uk.shape[-1]
    q_lat = torch.einsum("bqhd,hdr->bhqr", q_nope, w_uk)  # (B, H, Q, r)
    q = torch.cat((q_lat, q_pe.transpose(1, 2)), dim=-1)  # (B, H, Q, r + dr)
    k = lat.unsqueeze(1)  # (B, 1, L, r + dr)
    v = lat[..., :r].unsqueeze(1)  # (B, 1, L, r)
    B, H, Q, _ = q.shape
    q = q.reshape(B, 1, H * Q, -1)  # every head a query of the one latent head
    mask = _bias(q_pos, lat.shape[1], q.dtype).expand(B, H, Q, -1).reshape(B, 1, H * Q, -1)
    o_lat = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).view(B, H, Q, r)
    return torch.einsum("bhqr,hvr->bqhv", o_lat, w_uv)


def _expanded_in_pieces(q_nope, q_pe, lat, q_pos, w_uk, w_uv, scale: float) -> torch.Tensor:
    """``_expanded`` for one prefill chunk (B = 1, its n queries the last n of its L positions)
    that expands no more than ``CONTEXT_CHUNK_TOKENS`` context positions at once: the causal
    attention over the n new tokens, then each piece of the L - n earlier positions (all
    visible), merged by their log-sum-exps."""
    n, length = q_pos.shape[1], int(q_pos[0, -1]) + 1
    q = torch.cat((q_nope, q_pe), dim=-1).transpose(1, 2)  # (1, H, n, dn + dr)
    new = torch.arange(n, device=q.device).view(1, n)
    out, lse = _partial(q, lat[:, length - n : length], new, w_uk, w_uv, scale)
    for first in range(0, length - n, CONTEXT_CHUNK_TOKENS):
        piece = lat[:, first : min(first + CONTEXT_CHUNK_TOKENS, length - n)]
        out, lse = merge_partials(out, lse, *_partial(q, piece, None, w_uk, w_uv, scale))
    return out.to(q_nope.dtype).transpose(1, 2)  # (1, n, H, dv)


def _partial(q, lat, q_pos, w_uk, w_uv, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H, Q, dn + dr) over the latents ``lat`` (B, L, r + dr) expanded, causal by ``q_pos``
    (B, Q) or (None) every key visible -> (B, H, Q, dv) fp32 output and (B, H, Q) log-sum-exp."""
    r = w_uk.shape[-1]
    c, k_pe = lat[..., :r], lat[..., r:]  # (B, L, r), (B, L, dr)
    k_nope = torch.einsum("blr,hdr->bhld", c, w_uk)  # (B, H, L, dn)
    v = torch.einsum("blr,hvr->bhlv", c, w_uv)  # (B, H, L, dv)
    k = torch.cat((k_nope, k_pe.unsqueeze(1).expand(-1, k_nope.shape[1], -1, -1)), dim=-1)  # (B, H, L, dn + dr)
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # (B, H, Q, L)
    if q_pos is not None:
        s = s + _bias(q_pos, lat.shape[1], s.dtype)
    lse = torch.logsumexp(s, dim=-1)  # (B, H, Q)
    p = torch.exp(s - torch.where(lse == float("-inf"), 0.0, lse).unsqueeze(-1))
    return torch.matmul(p, v.float()), lse


def _expanded(q_nope, q_pe, lat, q_pos, w_uk, w_uv, scale: float) -> torch.Tensor:
    """Same contract as ``_absorbed``: the latents expanded to per-head keys and values first."""
    r = w_uk.shape[-1]
    c, k_pe = lat[..., :r], lat[..., r:]  # (B, L, r), (B, L, dr)
    k_nope = torch.einsum("blr,hdr->bhld", c, w_uk)  # (B, H, L, dn)
    v = torch.einsum("blr,hvr->bhlv", c, w_uv)  # (B, H, L, dv)
    k = torch.cat((k_nope, k_pe.unsqueeze(1).expand(-1, k_nope.shape[1], -1, -1)), dim=-1)  # (B, H, L, dn + dr)
    q = torch.cat((q_nope, q_pe), dim=-1).transpose(1, 2)  # (B, H, Q, dn + dr)
    mask = _bias(q_pos, lat.shape[1], q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).transpose(1, 2)  # (B, Q, H, dv)
