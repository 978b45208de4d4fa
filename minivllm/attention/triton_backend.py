"""The paged attention backend built on the Triton kernels in ``attention.ops``."""

from __future__ import annotations

import torch

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.attention.mla import mla_attention
from minivllm.attention.ops import paged_attention, triton_kv_write, write_kv
from minivllm.attention.ops.triton_mla_decode import mla_decode


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
        """MLA (``attention/mla.py``): a step of decode tokens only runs the Triton latent kernel
        (absorbed form, ``ops/triton_mla_decode.py``) after the Triton latent write, reading
        nothing on the host (so CUDA graphs capture it); a step with a prefill chunk takes the
        torch path (prefill chunks expanded, its decode tokens absorbed)."""
        if meta.max_query_len > 1 or meta.num_reqs != meta.num_tokens:
            return mla_attention(
                q_nope, q_pe, latent, kv_cache, meta, w_uk=w_uk, w_uv=w_uv, scale=scale, k_scale=k_scale
            )
        triton_kv_write.write_latent(latent, kv_cache, meta.slot_mapping, k_scale)
        q_lat = torch.einsum("thd,hdr->thr", q_nope, w_uk)  # (T, H, r): the queries in the latent space
        q = torch.cat((q_lat, q_pe), dim=-1)  # (T, H, r + dr)
        o_lat = mla_decode(
            q, kv_cache, meta.block_tables, meta.seq_lens, kv_lora_rank=w_uk.shape[-1], scale=scale, k_scale=k_scale
        )
        return torch.einsum("thr,hvr->thv", o_lat, w_uv)  # (T, H, dv)
