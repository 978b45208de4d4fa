"""The paged attention backend built on the Triton kernels in ``attention.ops``."""

from __future__ import annotations

import torch

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.attention.mla import MLAPlan, expand_context, merge_partials
from minivllm.attention.ops import paged_attention, triton_kv_write, write_kv
from minivllm.attention.ops.triton_mla_decode import mla_decode
from minivllm.attention.ops.triton_mla_prefill import mla_prefill


class TritonAttentionBackend(AttentionBackend):
    """Writes the step's keys/values into the paged cache, then runs one
    attention kernel over the whole mixed batch (decode and prefill chunks).

    Runs on CUDA, or on the CPU through Triton's interpreter
    (``TRITON_INTERPRET=1``, slow: tests only). Output rows of padding tokens
    (past ``query_start_loc[-1]``) are left uninitialized.
    """

    name = "triton"

    def forward(
        self,
        query: torch.Tensor,  # (T, num_heads, head_dim)
        key: torch.Tensor,  # (T, num_kv_heads, head_dim)
        value: torch.Tensor,  # (T, num_kv_heads, head_dim)
        kv_cache: torch.Tensor,  # (2, num_blocks, block_size, num_kv_heads, head_dim)
        meta: AttentionMetadata,
        *,
        scale: float,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        sinks: torch.Tensor | None = None,  # (num_heads,)
        kv_written: bool = False,
    ) -> torch.Tensor:  # (T, num_heads, head_dim)
        """``kv_written``: the layer already stored the step's keys and values (``Attention.prepare_qkv_``)."""
        if not kv_written:
            write_kv(key, value, kv_cache, meta.slot_mapping, k_scale, v_scale)
        return paged_attention(
            query,
            kv_cache,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_tables,
            max_query_len=meta.max_query_len,
            max_seq_len=meta.max_seq_len,
            scale=scale,
            sliding_window=sliding_window,
            logits_soft_cap=logits_soft_cap,
            k_scale=k_scale,
            v_scale=v_scale,
            sinks=sinks,
        )

    def forward_mla(
        self,
        q_nope: torch.Tensor,  # (T, H, dn)
        q_pe: torch.Tensor,  # (T, H, dr), rotated
        latent: torch.Tensor,  # (T, r + dr)
        kv_cache: torch.Tensor,  # (num_blocks, block_size, 1, r + dr)
        meta: AttentionMetadata,
        *,
        w_uk: torch.Tensor,  # (H, dn, r)
        w_uv: torch.Tensor,  # (H, dv, r)
        scale: float,
        k_scale: float = 1.0,
    ) -> torch.Tensor:  # (T, H, dv)
        """MLA (``attention/mla.py``) after the Triton latent write. A step of decode tokens only
        runs the Triton latent kernel (absorbed form, ``ops/triton_mla_decode.py``) reading nothing
        on the host, so CUDA graphs capture it. A step with prefill chunks splits its requests once
        (a host plan shared by the layers): the decode requests' rows go to the same kernel, the
        prefill requests' rows, all at once, to the expanded form (``expand_context``, then the
        Triton kernel of ``ops/triton_mla_prefill.py``) over their new tokens and then their earlier
        context piece by piece (``_expanded_prefill``)."""
        triton_kv_write.write_latent(latent, kv_cache, meta.slot_mapping, k_scale)
        if meta.max_query_len == 1 and meta.num_reqs == meta.num_tokens:
            return _absorbed_decode(
                q_nope, q_pe, kv_cache, meta.block_tables, meta.seq_lens, w_uk, w_uv, scale, k_scale
            )
        plan = meta.mla_plan
        if plan is None:
            plan = meta.mla_plan = MLAPlan.build(meta, kv_cache.shape[1], q_nope.device, None, varlen=True)
        T, H, _ = q_nope.shape
        out = q_nope.new_zeros(T, H, w_uv.shape[1])  # padding rows stay zero
        if plan.decode_tokens is not None:
            rows, reqs = plan.decode_tokens, plan.decode_reqs
            tables, seq_lens = meta.block_tables[reqs], meta.seq_lens[reqs]
            out[rows] = _absorbed_decode(
                q_nope[rows], q_pe[rows], kv_cache, tables, seq_lens, w_uk, w_uv, scale, k_scale
            )
        if plan.prefill_tokens is not None:
            rows = plan.prefill_tokens
            out[rows] = _expanded_prefill(q_nope[rows], q_pe[rows], kv_cache, plan, w_uk, w_uv, scale, k_scale)
        return out


def _expanded_prefill(q_nope, q_pe, kv_cache, plan: MLAPlan, w_uk, w_uv, scale: float, k_scale: float):
    """q_nope (Tq, H, dn), q_pe (Tq, H, dr): the prefill requests' queries -> (Tq, H, dv). Causal attention
    over their new tokens, then, piece by piece (``plan.prefill_pieces``), over their earlier context with
    every key visible, merged by log-sum-exp: no more than one piece is expanded at once."""
    cu_q, max_q = plan.prefill_cu_q, plan.prefill_max_q
    new = expand_context(kv_cache, plan.prefill_new_slots, w_uk, w_uv, q_nope.dtype, k_scale)
    if not plan.prefill_pieces:
        return mla_prefill(q_nope, q_pe, *new, cu_q, cu_q, max_query_len=max_q, scale=scale)
    out, lse = merge_partials(
        None, None, *mla_prefill(q_nope, q_pe, *new, cu_q, cu_q, max_query_len=max_q, scale=scale, return_lse=True)
    )
    del new
    for first, end, cu_k in plan.prefill_pieces:
        piece = expand_context(kv_cache, plan.prefill_ctx_slots[first:end], w_uk, w_uv, q_nope.dtype, k_scale)
        part = mla_prefill(
            q_nope, q_pe, *piece, cu_q, cu_k, max_query_len=max_q, scale=scale, causal=False, return_lse=True
        )
        del piece
        out, lse = merge_partials(out, lse, *part)
    return out.to(q_nope.dtype)


def _absorbed_decode(q_nope, q_pe, kv_cache, block_tables, seq_lens, w_uk, w_uv, scale: float, k_scale: float):
    """q_nope (B, H, dn), q_pe (B, H, dr): one query per request -> (B, H, dv) through the latent kernel."""
    q_lat = torch.einsum("thd,hdr->thr", q_nope, w_uk)  # (B, H, r): the queries in the latent space
    q = torch.cat((q_lat, q_pe), dim=-1)  # (B, H, r + dr)
    o_lat = mla_decode(q, kv_cache, block_tables, seq_lens, kv_lora_rank=w_uk.shape[-1], scale=scale, k_scale=k_scale)
    return torch.einsum("thr,hvr->thv", o_lat, w_uv)  # (B, H, dv)
