"""MLA prefill attention (DeepSeek V2/V3) over expanded keys and values, in Triton.

The expanded form of ``attention/mla.py`` for the prefill requests of a step: their
whole contexts (cached latents and the chunk's new ones) were gathered from the
paged latent cache and up-projected once (``expand_context``: one GEMM per ``W_UK``
/ ``W_UV`` for all of them), so this kernel is causal varlen attention whose key
is split in two: a per-head part ``k_nope`` and the rope part ``k_pe`` that every
head shares (never broadcast to H copies), and whose value has its own width::

    grid = (cdiv(max_query_len, BLOCK_M), num_prefill_requests, num_heads)
    q_nope (Tq, H, DN), q_pe (Tq, H, DR)     the requests' queries, request after request
    k_nope (Lk, H, DN), k_pe (Lk, DR)        their contexts' keys, request after request
    v      (Lk, H, DV)
    out    (Tq, H, DV)
    cu_q (P + 1,), cu_k (P + 1,)             where each request's rows start

Request i's n queries are the last n of its L context positions: query j sits at
position ``L - n + j`` and sees keys ``0 .. L - n + j`` (``CAUSAL``); or, for a piece of
earlier context (``attention/mla.py`` expands a long context piece by piece), every one
of its L keys. Each row's log-sum-exp (natural log, -inf: no key) is stored beside the
output when asked (``STORE_LSE``), so the pieces' partial outputs merge into the whole
softmax. A program takes BLOCK_M queries of one request and one head and streams keys
BLOCK_N at a time (online softmax in fp32), stopping at its last query's position.

Why expanded and not a kernel over the latents that up-projects each key tile: every
query tile would repeat that up-projection (H * L * r * (DN + DV) multiply-adds per
tile), which for a chunk of many tiles costs more than the attention itself; expanding
once costs it once. (The absorbed form over the latents, as decode uses, would score
with width r + DR = 576 instead of DN + DR = 192 for V3: 3x the FLOPs of a prefill.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.attention.ops.paged_attention_kernels import _dot


@triton.jit
def _mla_prefill_kernel(
    q_nope_ptr,
    q_pe_ptr,
    k_nope_ptr,
    k_pe_ptr,
    v_ptr,
    out_ptr,
    lse_ptr,
    cu_q_ptr,
    cu_k_ptr,
    scale,
    stride_qn_t,
    stride_qn_h,
    stride_qp_t,
    stride_qp_h,
    stride_kn_t,
    stride_kn_h,
    stride_kp_t,
    stride_v_t,
    stride_v_h,
    stride_o_t,
    stride_o_h,
    stride_lse_t,
    DN: tl.constexpr,
    DR: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_DN: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP32_DOT: tl.constexpr,
    CAUSAL: tl.constexpr,
    STORE_LSE: tl.constexpr,
):
    req = tl.program_id(1)
    head = tl.program_id(2).to(tl.int64)
    q_start = tl.load(cu_q_ptr + req)
    n = tl.load(cu_q_ptr + req + 1) - q_start
    first = tl.program_id(0) * BLOCK_M
    if first >= n:
        return
    k_start = tl.load(cu_k_ptr + req).to(tl.int64)
    length = tl.load(cu_k_ptr + req + 1) - k_start

    offs_m = first + tl.arange(0, BLOCK_M)
    m_ok = offs_m < n
    q_pos = length - n + offs_m  # (BLOCK_M,) the queries' positions in the context
    rows = (q_start + offs_m).to(tl.int64)
    offs_dn, offs_dr, offs_dv = tl.arange(0, BLOCK_DN), tl.arange(0, BLOCK_DR), tl.arange(0, BLOCK_DV)
    dn_ok, dr_ok, dv_ok = offs_dn < DN, offs_dr < DR, offs_dv < DV
    qn = tl.load(
        q_nope_ptr + rows[:, None] * stride_qn_t + head * stride_qn_h + offs_dn[None, :],
        mask=m_ok[:, None] & dn_ok[None, :],
        other=0.0,
    )
    qp = tl.load(
        q_pe_ptr + rows[:, None] * stride_qp_t + head * stride_qp_h + offs_dr[None, :],
        mask=m_ok[:, None] & dr_ok[None, :],
        other=0.0,
    )

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    lsum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    if CAUSAL:
        end = tl.minimum(length, length - n + first + BLOCK_M)  # past the block's last query: masked anyway
    else:
        end = length
    for start in range(0, end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        pos_ok = pos < end
        keys = k_start + pos
        kn = tl.load(
            k_nope_ptr + keys[:, None] * stride_kn_t + head * stride_kn_h + offs_dn[None, :],
            mask=pos_ok[:, None] & dn_ok[None, :],
            other=0.0,
        )
        kp = tl.load(
            k_pe_ptr + keys[:, None] * stride_kp_t + offs_dr[None, :], mask=pos_ok[:, None] & dr_ok[None, :], other=0.0
        )
        s = _dot(qn, tl.trans(kn), FP32_DOT) + _dot(qp, tl.trans(kp), FP32_DOT)  # (BLOCK_M, BLOCK_N)
        if CAUSAL:
            visible = pos_ok[None, :] & (pos[None, :] <= q_pos[:, None])
        else:
            visible = pos_ok[None, :] & m_ok[:, None]
        s = tl.where(visible, s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows of padding queries see nothing
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        v = tl.load(
            v_ptr + keys[:, None] * stride_v_t + head * stride_v_h + offs_dv[None, :],
            mask=pos_ok[:, None] & dv_ok[None, :],
            other=0.0,
        )
        lsum = lsum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, FP32_DOT)
        m = m_new
    out = acc / tl.where(lsum == 0.0, 1.0, lsum)[:, None]
    tl.store(
        out_ptr + rows[:, None] * stride_o_t + head * stride_o_h + offs_dv[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=m_ok[:, None] & dv_ok[None, :],
    )
    if STORE_LSE:
        lse = tl.where(lsum == 0.0, float("-inf"), m + tl.log(tl.where(lsum == 0.0, 1.0, lsum)))
        tl.store(lse_ptr + rows * stride_lse_t + head, lse, mask=m_ok)


def launch_constexprs(
    nope_dim: int, rope_dim: int, v_dim: int, fp32_dot: bool, causal: bool = True, store_lse: bool = False
) -> dict:
    """The kernel's compile-time parameters for one model shape (also ``tools/kernel_variants.py``'s).
    ``fp32_dot``: multiply in IEEE fp32 (fp32 inputs, or the interpreter, whose bf16 dot is wrong)."""
    return dict(
        DN=nope_dim,
        DR=rope_dim,
        DV=v_dim,
        BLOCK_DN=max(16, triton.next_power_of_2(nope_dim)),
        BLOCK_DR=max(16, triton.next_power_of_2(rope_dim)),
        BLOCK_DV=max(16, triton.next_power_of_2(v_dim)),
        BLOCK_M=64 if nope_dim + rope_dim <= 192 and not fp32_dot else 32,
        BLOCK_N=32,
        FP32_DOT=fp32_dot,
        CAUSAL=causal,
        STORE_LSE=store_lse,
    )


NUM_WARPS = 8
NUM_STAGES = 2


def mla_prefill(
    q_nope: torch.Tensor,  # (Tq, H, DN)
    q_pe: torch.Tensor,  # (Tq, H, DR)
    k_nope: torch.Tensor,  # (Lk, H, DN)
    k_pe: torch.Tensor,  # (Lk, DR): shared by every head
    v: torch.Tensor,  # (Lk, H, DV)
    cu_q: torch.Tensor,  # (P + 1,) int32
    cu_k: torch.Tensor,  # (P + 1,) int32
    *,
    max_query_len: int,
    scale: float,
    causal: bool = True,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # (Tq, H, DV) in q's dtype [, (Tq, H) fp32 LSE]
    """Attention of each prefill request's queries over its expanded keys: causal (its queries the
    last of its keys), or every key visible (``causal=False``: a piece of earlier context).
    ``return_lse``: also each row's log-sum-exp, to merge with other pieces' (``mla.merge_partials``)."""
    Tq, H, DN = q_nope.shape
    Lk, DR = k_pe.shape
    DV = v.shape[-1]
    if q_pe.shape != (Tq, H, DR) or k_nope.shape != (Lk, H, DN) or v.shape[:2] != (Lk, H):
        raise ValueError(
            f"mla_prefill: q_nope {tuple(q_nope.shape)}, q_pe {tuple(q_pe.shape)}, k_nope {tuple(k_nope.shape)}, "
            f"k_pe {tuple(k_pe.shape)}, v {tuple(v.shape)} do not agree"
        )
    if any(t.stride(-1) != 1 for t in (q_nope, q_pe, k_nope, k_pe, v)):
        raise ValueError("mla_prefill: every input's last dim must be contiguous")
    if cu_q.shape != cu_k.shape or cu_q.dim() != 1:
        raise ValueError(f"mla_prefill: cu_q {tuple(cu_q.shape)} and cu_k {tuple(cu_k.shape)} must be (P + 1,)")
    out = q_nope.new_empty(Tq, H, DV)
    lse = torch.full((Tq, H), float("-inf"), dtype=torch.float32, device=q_nope.device) if return_lse else out
    num_reqs = cu_q.shape[0] - 1
    if Tq == 0 or num_reqs == 0:
        return (out, lse) if return_lse else out
    fp32_dot = q_nope.dtype == torch.float32 or not q_nope.is_cuda
    consts = launch_constexprs(DN, DR, DV, fp32_dot, causal, return_lse)
    grid = (triton.cdiv(max_query_len, consts["BLOCK_M"]), num_reqs, H)
    _mla_prefill_kernel[grid](
        q_nope,
        q_pe,
        k_nope,
        k_pe,
        v,
        out,
        lse,
        cu_q,
        cu_k,
        scale,
        q_nope.stride(0),
        q_nope.stride(1),
        q_pe.stride(0),
        q_pe.stride(1),
        k_nope.stride(0),
        k_nope.stride(1),
        k_pe.stride(0),
        v.stride(0),
        v.stride(1),
        out.stride(0),
        out.stride(1),
        lse.stride(0),
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
        **consts,
    )
    return (out, lse) if return_lse else out
