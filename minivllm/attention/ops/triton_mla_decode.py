"""MLA decode attention over the paged latent cache (DeepSeek V2/V3), in Triton.

The absorbed form of ``attention/mla.py`` with one query per request: every query
head attends to the same latent "head" (key ``[c ; k_pe]`` of width R + DR, value
``c`` of width R), so one program takes a block of ``BLOCK_H`` heads of one request
and streams that request's latents once for all of them::

    grid = (num_requests, cdiv(num_heads, BLOCK_H))
    q:        (B, H, R + DR)    [W_UK^T q_nope ; q_pe], one row per request
    kv_cache: (num_blocks, block_size, 1, R + DR)
    out:      (B, H, R)         latent outputs (the caller applies W_UV)

Keys are taken ``BLOCK_N`` positions at a time (across block boundaries: each
position's block comes from the block table), with an online softmax in fp32.
An fp8 cache is read back as ``stored * k_scale``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.attention.kv_quant import is_fp8
from minivllm.attention.ops.paged_attention_kernels import _dot


@triton.jit
def _mla_decode_kernel(
    q_ptr,
    kv_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    scale,
    k_scale,
    num_heads,
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_bt,
    stride_kv_slot,
    R: tl.constexpr,
    DR: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    FP8_KV: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    req = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < num_heads
    offs_r = tl.arange(0, BLOCK_R)
    offs_dr = tl.arange(0, BLOCK_DR)
    r_ok, dr_ok = offs_r < R, offs_dr < DR
    q_row = q_ptr + req * stride_qb + heads[:, None] * stride_qh
    q_lat = tl.load(q_row + offs_r[None, :], mask=head_ok[:, None] & r_ok[None, :], other=0.0)
    q_pe = tl.load(q_row + R + offs_dr[None, :], mask=head_ok[:, None] & dr_ok[None, :], other=0.0)
    seq_len = tl.load(seq_lens_ptr + req)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < seq_len
        block = tl.load(block_tables_ptr + req * stride_bt + pos // PAGE, mask=pos_ok, other=0)
        slot = (block.to(tl.int64) * PAGE + pos % PAGE) * stride_kv_slot
        c = tl.load(kv_ptr + slot[:, None] + offs_r[None, :], mask=pos_ok[:, None] & r_ok[None, :], other=0.0)
        k_pe = tl.load(kv_ptr + slot[:, None] + R + offs_dr[None, :], mask=pos_ok[:, None] & dr_ok[None, :], other=0.0)
        if FP8_KV:  # stored / scale: scale back up in the queries' dtype
            c = (c.to(tl.float32) * k_scale).to(q_lat.dtype)
            k_pe = (k_pe.to(tl.float32) * k_scale).to(q_lat.dtype)
        s = _dot(q_lat, tl.trans(c), FP32_DOT) + _dot(q_pe, tl.trans(k_pe), FP32_DOT)  # (BLOCK_H, BLOCK_N)
        s = tl.where(pos_ok[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        lsum = lsum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _dot(p.to(c.dtype), c, FP32_DOT)
        m = m_new
    out = acc / lsum[:, None]
    out_row = out_ptr + req * stride_ob + heads[:, None] * stride_oh
    tl.store(out_row + offs_r[None, :], out.to(out_ptr.dtype.element_ty), mask=head_ok[:, None] & r_ok[None, :])


def launch_constexprs(
    kv_lora_rank: int, rope_dim: int, num_heads: int, block_size: int, fp8_kv: bool, fp32_dot: bool
) -> dict:
    """The kernel's compile-time parameters for one model shape (also ``tools/kernel_variants.py``'s).
    ``fp32_dot``: multiply in IEEE fp32 (fp32 queries, or the interpreter, whose bf16 dot is wrong)."""
    return dict(
        R=kv_lora_rank,
        DR=rope_dim,
        BLOCK_R=triton.next_power_of_2(kv_lora_rank),
        BLOCK_DR=max(16, triton.next_power_of_2(rope_dim)),
        BLOCK_H=16 if num_heads >= 16 or kv_lora_rank > 128 else max(16, triton.next_power_of_2(num_heads)),
        BLOCK_N=16,
        PAGE=block_size,
        FP8_KV=fp8_kv,
        FP32_DOT=fp32_dot,
    )


def num_warps_for(kv_lora_rank: int) -> int:
    return 8 if kv_lora_rank >= 256 else 4


def mla_decode(
    q: torch.Tensor,  # (B, H, R + DR): one query per request, [q_lat ; q_pe]
    kv_cache: torch.Tensor,  # (num_blocks, block_size, 1, R + DR)
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    seq_lens: torch.Tensor,  # (B,) int32
    *,
    kv_lora_rank: int,
    scale: float,
    k_scale: float = 1.0,
) -> torch.Tensor:  # (B, H, R) in q's dtype
    """Latent attention of one decode query per request (the absorbed form)."""
    B, H, width = q.shape
    num_blocks, block_size, one, cache_width = kv_cache.shape
    if one != 1 or cache_width != width:
        raise ValueError(f"mla_decode: cache {tuple(kv_cache.shape)} is not a latent cache of width {width}")
    if not 0 < kv_lora_rank < width:
        raise ValueError(f"mla_decode: kv_lora_rank={kv_lora_rank} must be below the latent width {width}")
    if q.stride(-1) != 1 or not kv_cache.is_contiguous():
        raise ValueError("mla_decode: q's last dim and the cache must be contiguous")
    if block_tables.shape[0] != B or seq_lens.shape != (B,):
        raise ValueError(
            f"mla_decode: {B} queries, {block_tables.shape[0]} block tables, {tuple(seq_lens.shape)} lengths"
        )
    out = q.new_empty(B, H, kv_lora_rank)
    fp32_dot = q.dtype == torch.float32 or not q.is_cuda
    consts = launch_constexprs(kv_lora_rank, width - kv_lora_rank, H, block_size, is_fp8(kv_cache), fp32_dot)
    grid = (B, triton.cdiv(H, consts["BLOCK_H"]))
    _mla_decode_kernel[grid](
        q,
        kv_cache,
        block_tables,
        seq_lens,
        out,
        scale,
        k_scale,
        H,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        block_tables.stride(0),
        kv_cache.stride(1),
        num_warps=num_warps_for(kv_lora_rank),
        **consts,
    )
    return out
