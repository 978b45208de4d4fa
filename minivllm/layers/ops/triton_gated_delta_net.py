"""Triton kernels of Gated DeltaNet (Qwen3-Next's linear-attention layers): the short causal
convolution over the mixed q/k/v channels, and the gated delta rule in its chunked (prefill)
and recurrent (decode) forms. Packed varlen tokens throughout; one state slot per sequence.

The delta rule, per head, with a state ``S`` (Dk, Dv), a key ``k`` and query ``q`` already
L2-normalised, a log-decay ``g <= 0`` and a write strength ``beta`` per token::

    S <- exp(g) * S
    S <- S + k (beta * (v - k^T S))        # the delta rule: write the correction only
    o  = scale * q^T S

The recurrent form runs exactly that, one token after the other, the state in registers
(one program per sequence, head and block of Dv columns): decode reads and writes each
state once per step, so its speed is the state's bytes over the memory bandwidth.

The chunked form (the WY / UT-transform formulation) makes prefill matmuls. Inside a chunk
of ``BT`` tokens with ``G`` the cumulative log-decay from the chunk's start, the ``BT``
updates collapse to ``S_end = exp(G_last) S + (K * exp(G_last - G))^T V'`` where the new
values ``V' = U - W S`` come from the unit-lower-triangular system
``(I + A) [U | W] = [beta V | beta K exp(G)]``, ``A_ij = beta_i k_i.k_j exp(G_i - G_j)``
for ``j < i``. The outputs are ``scale * (Q exp(G) S + (Q K^T o exp(G_i - G_j))_{j<=i} V')``.
Three kernels, so that no program holds more than two (BT, Dk) tiles (none spills):
``_chunk_wy_kernel`` solves each chunk's system (all chunks in parallel: it needs no state)
into fp32 scratch ``W`` (T, H, Dk) and ``U`` (T, H, Dv); ``_chunk_state_kernel`` walks each
sequence's chunks in order, the state in registers, turning ``U`` into ``V'`` in place and
recording the state each chunk starts from (C, H, Dk, Dv); ``_chunk_output_kernel`` makes
the outputs of all chunks in parallel. The triangular inverse is block forward substitution:
elementwise inside 16-row diagonal blocks (all blocks at once), then the blocks joined by
matmuls (a Neumann series in powers of ``A`` itself would cancel catastrophically when keys
repeat).

Shapes: q, k (T, H, Dk) and v (T, H, Dv) with any token and head strides (unit stride in
the last dim): the caller has expanded k-heads to the v-heads; g, beta (T, H) fp32;
states (num_slots, H, Dk, Dv) fp32, sequence ``i``'s final state written in place to
``states[state_indices[i]]``; ``has_initial_state[i]`` False starts it from zeros; a negative
slot (a padding entry of a CUDA-graph batch) is skipped: no state read or written, its
outputs left unwritten. Every
sum and matmul is fp32: Triton's interpreter computes bf16 ``tl.dot`` wrongly, and on a
GPU the fp32 dots run in TF32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.attention.ops.checks import SUPPORTED_DTYPES, check_launchable, check_tensor, require

CONV_BLOCK_T = 8  # tokens of one conv tile
CONV_BLOCK_C = 128  # channels of one conv program
CONV_NUM_WARPS = 8  # 4 elements of a tile per thread: at 4 warps the unrolled taps nearly spill on sm_90
RECURRENT_BLOCK_V = 32  # Dv columns of one recurrent program: Dk x 32 fp32 state in registers
CHUNK_BLOCK_V = 16  # Dv columns of one chunk-state program (and of a WY step)
OUTPUT_BLOCK_V = 64  # Dv columns of one chunk-output program
CHUNK_NUM_WARPS = 8
SOLVE_BLOCK = 16  # the WY solve's diagonal blocks: forward substitution inside, dots between


# --------------------------------------------------------------------------------------------
# Causal depthwise conv1d over packed sequences, with a (K - 1)-input state per sequence.


@triton.jit
def _causal_conv1d_kernel(
    x_ptr,  # (T, C)
    w_ptr,  # (C, K)
    b_ptr,  # (C,) or a dummy when HAS_BIAS is False
    y_ptr,  # (T, C)
    state_ptr,  # (num_slots, C, K - 1)
    state_idx_ptr,  # (N,)
    cu_ptr,  # (N + 1,) int32
    has_init_ptr,  # (N,) bool
    channels,
    stride_xt,
    stride_yt,
    stride_wc,
    stride_ss,
    stride_sc,
    stride_sk,
    K: tl.constexpr,
    KPAD: tl.constexpr,  # next power of two >= K - 1
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """One program per (sequence, block of BLOCK_C channels): the sequence's outputs tile by
    tile, then its last K - 1 inputs into the state slot (after a barrier: every read of the
    old state comes first). Tile addresses are int32 offsets from per-tile base pointers."""
    n = tl.program_id(0)
    c0 = tl.program_id(1) * BLOCK_C
    cols = tl.arange(0, BLOCK_C)
    cmask = c0 + cols < channels
    start = tl.load(cu_ptr + n).to(tl.int64)
    end = tl.load(cu_ptr + n + 1).to(tl.int64)
    slot = tl.load(state_idx_ptr + n).to(tl.int64)
    if slot < 0:  # a padding entry (PAD_SLOT_ID): no state, outputs left unwritten
        return
    init = tl.load(has_init_ptr + n).to(tl.int32)  # 0: start from zeros
    lo = start - (K - 1) * init  # the first position the old state provides (none: start)
    state_base = state_ptr + slot * stride_ss + c0 * stride_sc
    if HAS_BIAS:
        bias = tl.load(b_ptr + c0 + cols, mask=cmask, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_C], dtype=tl.float32)
    rows = tl.arange(0, BLOCK_T)
    for t0 in range(start, end, BLOCK_T):
        live = t0 + rows < end
        x_base = x_ptr + t0 * stride_xt + c0
        acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32) + bias[None, :]
        for k in tl.static_range(K):
            r = rows - (K - 1) + k  # the input row tap k reads, relative to t0
            p = t0 + r
            xv = tl.load(
                x_base + r[:, None] * stride_xt + cols[None, :],
                mask=(live & (p >= start))[:, None] & cmask[None, :],
                other=0.0,
            ).to(tl.float32)
            # position p < start is the old state's column (K - 1) + (p - start)
            sv = tl.load(
                state_base + cols[None, :] * stride_sc + ((K - 1) + (p - start)).to(tl.int32)[:, None] * stride_sk,
                mask=(live & (p >= lo) & (p < start))[:, None] & cmask[None, :],
                other=0.0,
            ).to(tl.float32)
            w = tl.load(w_ptr + (c0 + cols) * stride_wc + k, mask=cmask, other=0.0).to(tl.float32)
            acc += (xv + sv) * w[None, :]
        if SILU:
            acc = acc / (1.0 + tl.exp(-acc))
        y_base = y_ptr + t0 * stride_yt + c0
        tl.store(
            y_base + rows[:, None] * stride_yt + cols[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=live[:, None] & cmask[None, :],
        )
    # the new state: inputs end-(K-1) .. end-1, older ones from the old state (or zeros)
    j = tl.arange(0, KPAD)
    p = end - (K - 1) + j  # [KPAD]
    jmask = j < K - 1
    in_x = p >= start
    xv = tl.load(
        x_ptr + (end - (K - 1)) * stride_xt + c0 + j[:, None] * stride_xt + cols[None, :],
        mask=(jmask & in_x)[:, None] & cmask[None, :],
        other=0.0,
    )
    state_offs = cols[None, :] * stride_sc  # [1, BLOCK_C]
    sv = tl.load(
        state_base + state_offs + ((K - 1) + (p - start)).to(tl.int32)[:, None] * stride_sk,
        mask=(jmask & (p >= lo) & (p < start))[:, None] & cmask[None, :],
        other=0.0,
    )
    new = tl.where(in_x[:, None], xv.to(tl.float32), sv.to(tl.float32))
    tl.debug_barrier()
    tl.store(
        state_base + state_offs + j[:, None] * stride_sk,
        new.to(state_ptr.dtype.element_ty),
        mask=jmask[:, None] & cmask[None, :],
    )


def conv_launch_constexprs(kernel_size: int, has_bias: bool, silu: bool) -> dict:
    """The conv kernel's compile-time arguments (also read by ``tools/kernel_report.py``)."""
    return dict(
        K=kernel_size,
        KPAD=max(triton.next_power_of_2(kernel_size - 1), 2),
        HAS_BIAS=has_bias,
        SILU=silu,
        BLOCK_T=CONV_BLOCK_T,
        BLOCK_C=CONV_BLOCK_C,
    )


def _check_varlen(state_indices, cu_seqlens, has_initial_state, device) -> int:
    """The per-sequence arguments: (N,), (N + 1,), (N,); returns N."""
    check_tensor(cu_seqlens, "cu_seqlens", device, dims=1)
    check_tensor(state_indices, "state_indices", device, dims=1)
    check_tensor(has_initial_state, "has_initial_state", device, dims=1)
    n = cu_seqlens.shape[0] - 1
    require(cu_seqlens.dtype == torch.int32, f"cu_seqlens must be int32, got {cu_seqlens.dtype}")
    require(
        state_indices.dtype in (torch.int32, torch.int64),
        f"state_indices must be int32/int64, got {state_indices.dtype}",
    )
    require(has_initial_state.dtype == torch.bool, f"has_initial_state must be bool, got {has_initial_state.dtype}")
    require(
        n >= 0 and state_indices.shape[0] == n and has_initial_state.shape[0] == n,
        f"{n} sequences by cu_seqlens, but state_indices has {state_indices.shape[0]} and has_initial_state "
        f"{has_initial_state.shape[0]}",
    )
    return n


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    conv_states: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Depthwise causal conv of each packed sequence of ``x`` (T, C) with ``weight`` (C, K),
    its left context the sequence's state ``conv_states[state_indices[i]]`` (C, K - 1) (zeros
    where ``has_initial_state[i]`` is False); then the state holds the sequence's last K - 1
    inputs (left-padded with the old state, or zeros). Returns y (T, C) in x's dtype. A
    negative slot (padding) is skipped: its state untouched, its outputs unwritten."""
    device = x.device
    check_launchable(device, _causal_conv1d_kernel)
    check_tensor(x, "x", device, dims=2)
    check_tensor(weight, "weight", device, dims=2)
    require(x.dtype in SUPPORTED_DTYPES, f"x dtype must be one of {SUPPORTED_DTYPES}, got {x.dtype}")
    require(activation in ("silu", None), f"activation must be 'silu' or None, got {activation!r}")
    tokens, channels = x.shape
    kernel_size = weight.shape[1]
    require(
        weight.shape[0] == channels and kernel_size >= 2,
        f"weight must be ({channels}, K >= 2), got {tuple(weight.shape)}",
    )
    require(
        conv_states.dim() == 3 and tuple(conv_states.shape[1:]) == (channels, kernel_size - 1),
        f"conv_states must be (num_slots, {channels}, {kernel_size - 1}), got {tuple(conv_states.shape)}",
    )
    require(conv_states.device == device, f"conv_states is on {conv_states.device}, expected {device}")
    if bias is not None:
        check_tensor(bias, "bias", device, dims=1)
        require(bias.shape[0] == channels, f"bias must be ({channels},), got {tuple(bias.shape)}")
    n = _check_varlen(state_indices, cu_seqlens, has_initial_state, device)
    y = torch.empty(tokens, channels, dtype=x.dtype, device=device)
    if n == 0:
        return y
    grid = (n, triton.cdiv(channels, CONV_BLOCK_C))
    _causal_conv1d_kernel[grid](
        x,
        weight,
        bias if bias is not None else weight,
        y,
        conv_states,
        state_indices,
        cu_seqlens,
        has_initial_state,
        channels,
        x.stride(0),
        y.stride(0),
        weight.stride(0),
        conv_states.stride(0),
        conv_states.stride(1),
        conv_states.stride(2),
        num_warps=CONV_NUM_WARPS,
        **conv_launch_constexprs(kernel_size, bias is not None, activation == "silu"),
    )
    return y


# --------------------------------------------------------------------------------------------
# The delta-rule kernels' shared index set-up.


@triton.jit
def _span(start_ptr, end_ptr, i):
    """Tokens [start, end) of entry ``i`` of a start and an end table, as int64: a chunk from
    the chunk table, or sequence ``i`` from cu_seqlens (``end_ptr = cu_ptr + 1``)."""
    start = tl.load(start_ptr + i).to(tl.int64)
    end = tl.load(end_ptr + i).to(tl.int64)
    return start, end


@triton.jit
def _head_columns(DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """All the key columns ``dk`` (BK,) and this program's block ``program_id(2)`` of BV
    value columns ``dv`` (BV,), with their masks ``kmask``, ``vmask``."""
    dk = tl.arange(0, BK)
    dv = tl.program_id(2) * BV + tl.arange(0, BV)
    return dk, dv, dk < DK, dv < DV


# --------------------------------------------------------------------------------------------
# The recurrent form: one token after the other (decode).


@triton.jit
def _recurrent_kernel(
    q_ptr,  # (T, H, Dk)
    k_ptr,  # (T, H, Dk)
    v_ptr,  # (T, H, Dv)
    g_ptr,  # (T, H) fp32
    beta_ptr,  # (T, H) fp32
    o_ptr,  # (T, H, Dv)
    state_ptr,  # (num_slots, H, Dk, Dv) fp32
    state_idx_ptr,  # (N,)
    cu_ptr,  # (N + 1,) int32
    has_init_ptr,  # (N,) bool
    scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_gt,
    stride_bt,
    stride_ot,
    stride_oh,
    stride_ss,
    stride_sh,
    stride_sk,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,  # next power of two >= DK
    BV: tl.constexpr,
):
    """One program per (sequence, head, block of BV value columns); the (Dk, BV) state in
    registers across the sequence's tokens."""
    n = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    dk, dv, kmask, vmask = _head_columns(DK, DV, BK, BV)
    start, end = _span(cu_ptr, cu_ptr + 1, n)
    slot = tl.load(state_idx_ptr + n).to(tl.int64)
    if slot < 0:  # a padding entry (PAD_SLOT_ID): no state, outputs left unwritten
        return
    init = tl.load(has_init_ptr + n).to(tl.int32)  # 0: start from zeros
    s_ptrs = state_ptr + slot * stride_ss + h * stride_sh + dk[:, None] * stride_sk + dv[None, :]
    smask = kmask[:, None] & vmask[None, :]
    state = tl.load(s_ptrs, mask=(dk < DK * init)[:, None] & vmask[None, :], other=0.0)  # [BK, BV] fp32
    for t in range(start, end):
        q = tl.load(q_ptr + t * stride_qt + h * stride_qh + dk, mask=kmask, other=0.0).to(tl.float32) * scale
        k = tl.load(k_ptr + t * stride_kt + h * stride_kh + dk, mask=kmask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + t * stride_vt + h * stride_vh + dv, mask=vmask, other=0.0).to(tl.float32)
        decay = tl.exp(tl.load(g_ptr + t * stride_gt + h))
        beta = tl.load(beta_ptr + t * stride_bt + h)
        state = state * decay
        delta = (v - tl.sum(state * k[:, None], axis=0)) * beta  # [BV]
        state = state + k[:, None] * delta[None, :]
        o = tl.sum(state * q[:, None], axis=0)
        tl.store(o_ptr + t * stride_ot + h * stride_oh + dv, o.to(o_ptr.dtype.element_ty), mask=vmask)
    tl.debug_barrier()
    tl.store(s_ptrs, state, mask=smask)


def recurrent_launch_constexprs(dk: int, dv: int) -> dict:
    """The recurrent kernel's compile-time arguments (also read by ``tools/kernel_report.py``)."""
    return dict(
        DK=dk,
        DV=dv,
        BK=triton.next_power_of_2(dk),
        BV=min(RECURRENT_BLOCK_V, triton.next_power_of_2(dv)),
    )


def _check_rule_inputs(q, k, v, g, beta, states, state_indices, cu_seqlens, has_initial_state):
    """Shapes, dtypes and devices of a delta-rule call; returns (N, H, Dk, Dv)."""
    device = v.device
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name, device, dims=3)
        require(t.dtype in SUPPORTED_DTYPES, f"{name} dtype must be one of {SUPPORTED_DTYPES}, got {t.dtype}")
    tokens, heads, dv = v.shape
    dk = q.shape[2]
    require(
        tuple(q.shape) == tuple(k.shape) == (tokens, heads, dk),
        f"q and k must be (T={tokens}, H={heads}, Dk) like v's tokens and heads (k-heads expanded), "
        f"got {tuple(q.shape)} and {tuple(k.shape)}",
    )
    for name, t in (("g", g), ("beta", beta)):
        check_tensor(t, name, device, dims=2)
        require(
            tuple(t.shape) == (tokens, heads) and t.dtype == torch.float32,
            f"{name} must be ({tokens}, {heads}) float32, got {tuple(t.shape)} {t.dtype}",
        )
    check_tensor(states, "states", device, dims=4)
    require(
        tuple(states.shape[1:]) == (heads, dk, dv) and states.dtype == torch.float32,
        f"states must be (num_slots, {heads}, {dk}, {dv}) float32, got {tuple(states.shape)} {states.dtype}",
    )
    n = _check_varlen(state_indices, cu_seqlens, has_initial_state, device)
    return n, heads, dk, dv


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    states: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """The gated delta rule token by token (the decode path); returns o (T, H, Dv) in v's
    dtype and writes each sequence's final state to its slot of ``states``."""
    device = v.device
    check_launchable(device, _recurrent_kernel)
    n, heads, dk, dv = _check_rule_inputs(q, k, v, g, beta, states, state_indices, cu_seqlens, has_initial_state)
    o = torch.empty(v.shape, dtype=v.dtype, device=device)
    if n == 0:
        return o
    constexprs = recurrent_launch_constexprs(dk, dv)
    _recurrent_kernel[(n, heads, triton.cdiv(dv, constexprs["BV"]))](
        q,
        k,
        v,
        g,
        beta,
        o,
        states,
        state_indices,
        cu_seqlens,
        has_initial_state,
        scale,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        g.stride(0),
        beta.stride(0),
        o.stride(0),
        o.stride(1),
        states.stride(0),
        states.stride(1),
        states.stride(2),
        **constexprs,
    )
    return o


# --------------------------------------------------------------------------------------------
# The chunked form: the WY system per chunk, the state passed from chunk to chunk, the outputs.


@triton.jit
def _chunk_wy_kernel(
    k_ptr,  # (T, H, Dk)
    v_ptr,  # (T, H, Dv)
    g_ptr,  # (T, H) fp32
    beta_ptr,  # (T, H) fp32
    w_ptr,  # (T, H, Dk) fp32 out: T (beta K exp(G))
    u_ptr,  # (T, H, Dv) fp32 out: T (beta V)
    chunk_start_ptr,  # (C,) int32: first token of the chunk
    chunk_end_ptr,  # (C,) int32: one past its last (== start for a padding entry)
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_gt,
    stride_bt,
    stride_wt,
    stride_wh,
    stride_ut,
    stride_uh,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BVU: tl.constexpr,  # Dv columns of U per step
    BT: tl.constexpr,
    SUB: tl.constexpr,  # rows of a diagonal block of the triangular solve
):
    """One program per (chunk, head): ``T = (I + A)^-1`` by block forward substitution,
    then ``W = T (beta K exp(G))`` and ``U = T (beta V)``."""
    h = tl.program_id(1).to(tl.int64)
    start, end = _span(chunk_start_ptr, chunk_end_ptr, tl.program_id(0))
    if end <= start:
        return
    rows = tl.arange(0, BT)
    live = start + rows < end
    dk = tl.arange(0, BK)
    kmask = dk < DK
    # tile-relative int32 offsets from per-chunk base pointers: cheap to keep or recompute
    k_base = k_ptr + start * stride_kt + h * stride_kh
    g = tl.load(g_ptr + (start + rows) * stride_gt + h, mask=live, other=0.0)
    beta = tl.load(beta_ptr + (start + rows) * stride_bt + h, mask=live, other=0.0)
    G = tl.cumsum(g, axis=0)  # [BT]
    key = tl.load(k_base + rows[:, None] * stride_kt + dk[None, :], mask=live[:, None] & kmask[None, :], other=0.0).to(
        tl.float32
    )  # [BT, BK]
    lower = rows[:, None] > rows[None, :]
    decay = tl.exp(tl.where(lower, G[:, None] - G[None, :], float("-inf")))
    a = tl.dot(key * beta[:, None], tl.trans(key)) * decay  # [BT, BT] strictly lower
    # T = (I + A)^-1 by blocks of SUB rows: I + A = D + E, D its block diagonal, E below it.
    # D^-1 by forward substitution, all blocks at once (row r of each block per step: row i
    # of D^-1 is e_i - sum_j A_ij D^-1_j over the earlier rows j of its block, all final);
    # then T = D^-1 - (D^-1 E) T, exact after BT / SUB - 1 steps (D^-1 E is nilpotent).
    blk = rows // SUB
    same = blk[:, None] == blk[None, :]
    a_diag = tl.where(same, a, 0.0)
    d_inv = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    for r in range(1, SUB):
        at_r = (rows % SUB == r)[:, None]
        a_r = tl.sum(tl.where(at_r, a_diag, 0.0), axis=0)  # [BT]: block b's part is A[SUB*b + r, block b]
        new = -tl.sum(a_r[:, None] * d_inv, axis=0)  # [BT]
        d_inv = tl.where(at_r & same, d_inv + new[None, :], d_inv)
    n_mat = tl.dot(d_inv, tl.where(same, 0.0, a))
    tri = d_inv
    for _ in range(BT // SUB - 1):
        tri = d_inv - tl.dot(n_mat, tri)
    key = tl.load(k_base + rows[:, None] * stride_kt + dk[None, :], mask=live[:, None] & kmask[None, :], other=0.0).to(
        tl.float32
    )  # again: not kept live across the loop
    w = tl.dot(tri, key * (beta * tl.exp(G))[:, None])
    w_base = w_ptr + start * stride_wt + h * stride_wh
    tl.store(w_base + rows[:, None] * stride_wt + dk[None, :], w, mask=live[:, None] & kmask[None, :])
    v_base = v_ptr + start * stride_vt + h * stride_vh
    u_base = u_ptr + start * stride_ut + h * stride_uh
    for v0 in range(0, DV, BVU):  # a loop, not unrolled: one V tile live at a time
        dv = v0 + tl.arange(0, BVU)
        v_mask = live[:, None] & (dv < DV)[None, :]
        val = tl.load(v_base + rows[:, None] * stride_vt + dv[None, :], mask=v_mask, other=0.0).to(tl.float32)
        u = tl.dot(tri, val * beta[:, None])
        tl.store(u_base + rows[:, None] * stride_ut + dv[None, :], u, mask=v_mask)


@triton.jit
def _chunk_state_kernel(
    k_ptr,  # (T, H, Dk)
    g_ptr,  # (T, H) fp32
    w_ptr,  # (T, H, Dk) fp32
    u_ptr,  # (T, H, Dv) fp32: U in, the new values V' = U - W S out (in place)
    h_ptr,  # (C, H, Dk, Dv) fp32 out: the state each chunk starts from
    state_ptr,  # (num_slots, H, Dk, Dv) fp32
    state_idx_ptr,  # (N,)
    cu_ptr,  # (N + 1,) int32
    has_init_ptr,  # (N,) bool
    first_chunk_ptr,  # (N,) int32: the sequence's first chunk in the chunk table
    stride_kt,
    stride_kh,
    stride_gt,
    stride_wt,
    stride_wh,
    stride_ut,
    stride_uh,
    stride_hc,
    stride_hh,
    stride_ss,
    stride_sh,
    stride_sk,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
):
    """One program per (sequence, head, block of BV value columns): the sequence's chunks in
    order, the (Dk, BV) state in registers; per chunk the state it starts from and the new
    values, then the final state."""
    n = tl.program_id(0)
    h = tl.program_id(1).to(tl.int64)
    dk, dv, kmask, vmask = _head_columns(DK, DV, BK, BV)
    rows = tl.arange(0, BT)
    start, end = _span(cu_ptr, cu_ptr + 1, n)
    slot = tl.load(state_idx_ptr + n).to(tl.int64)
    if slot < 0:  # a padding entry (PAD_SLOT_ID): no state, outputs left unwritten
        return
    init = tl.load(has_init_ptr + n).to(tl.int32)  # 0: start from zeros
    chunk = tl.load(first_chunk_ptr + n).to(tl.int64)
    s_offs = dk[:, None] * stride_sk + dv[None, :]
    smask = kmask[:, None] & vmask[None, :]
    s_ptrs = state_ptr + slot * stride_ss + h * stride_sh + s_offs
    state = tl.load(s_ptrs, mask=(dk < DK * init)[:, None] & vmask[None, :], other=0.0)  # [BK, BV] fp32
    h_offs = dk[:, None] * DV + dv[None, :]
    for c0 in range(start, end, BT):
        tl.store(h_ptr + chunk * stride_hc + h * stride_hh + h_offs, state, mask=smask)
        pos = c0 + rows
        live = pos < end
        km = live[:, None] & kmask[None, :]
        vm = live[:, None] & vmask[None, :]
        g = tl.load(g_ptr + pos * stride_gt + h, mask=live, other=0.0)
        g_last = tl.sum(g, axis=0)
        G = tl.cumsum(g, axis=0)  # [BT]; flat past the chunk's end (g = 0 there)
        w = tl.load(w_ptr + pos[:, None] * stride_wt + h * stride_wh + dk[None, :], mask=km, other=0.0)
        u_ptrs = u_ptr + pos[:, None] * stride_ut + h * stride_uh + dv[None, :]
        v_new = tl.load(u_ptrs, mask=vm, other=0.0) - tl.dot(w, state)  # [BT, BV]
        tl.store(u_ptrs, v_new, mask=vm)
        key = tl.load(k_ptr + pos[:, None] * stride_kt + h * stride_kh + dk[None, :], mask=km, other=0.0)
        key = key.to(tl.float32) * tl.exp(g_last - G)[:, None]
        state = state * tl.exp(g_last) + tl.dot(tl.trans(key), v_new)
        chunk += 1
    tl.debug_barrier()
    tl.store(s_ptrs, state, mask=smask)


@triton.jit
def _chunk_output_kernel(
    q_ptr,  # (T, H, Dk)
    k_ptr,  # (T, H, Dk)
    g_ptr,  # (T, H) fp32
    u_ptr,  # (T, H, Dv) fp32: the new values V'
    h_ptr,  # (C, H, Dk, Dv) fp32: the state each chunk starts from
    o_ptr,  # (T, H, Dv)
    chunk_start_ptr,  # (C,) int32
    chunk_end_ptr,  # (C,) int32
    scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_gt,
    stride_ut,
    stride_uh,
    stride_hc,
    stride_hh,
    stride_ot,
    stride_oh,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
):
    """One program per (chunk, head, block of BV value columns):
    ``o = scale * (Q exp(G) S + (Q K^T o exp(G_i - G_j))_{j<=i} V')``."""
    c = tl.program_id(0).to(tl.int64)  # c * stride_hc passes 2**31 past 4096 chunks at H32 Dk=Dv=128
    h = tl.program_id(1).to(tl.int64)
    start, end = _span(chunk_start_ptr, chunk_end_ptr, c)
    if end <= start:
        return
    dk, dv, kmask, vmask = _head_columns(DK, DV, BK, BV)
    rows = tl.arange(0, BT)
    pos = start + rows
    live = pos < end
    km = live[:, None] & kmask[None, :]
    vm = live[:, None] & vmask[None, :]
    g = tl.load(g_ptr + pos * stride_gt + h, mask=live, other=0.0)
    G = tl.cumsum(g, axis=0)  # [BT]
    q = tl.load(q_ptr + pos[:, None] * stride_qt + h * stride_qh + dk[None, :], mask=km, other=0.0)
    q = q.to(tl.float32) * scale
    key = tl.load(k_ptr + pos[:, None] * stride_kt + h * stride_kh + dk[None, :], mask=km, other=0.0)
    causal = rows[:, None] >= rows[None, :]
    attn = tl.dot(q, tl.trans(key.to(tl.float32))) * tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")))
    v_new = tl.load(u_ptr + pos[:, None] * stride_ut + h * stride_uh + dv[None, :], mask=vm, other=0.0)
    state = tl.load(
        h_ptr + c * stride_hc + h * stride_hh + dk[:, None] * DV + dv[None, :],
        mask=kmask[:, None] & vmask[None, :],
        other=0.0,
    )
    o = tl.dot(q * tl.exp(G)[:, None], state) + tl.dot(attn, v_new)
    tl.store(o_ptr + pos[:, None] * stride_ot + h * stride_oh + dv[None, :], o.to(o_ptr.dtype.element_ty), mask=vm)


def chunk_launch_constexprs(dk: int, dv: int, chunk_size: int) -> dict[str, dict]:
    """The chunk kernels' compile-time arguments by kernel: ``wy``, ``state``, ``output``
    (also read by ``tools/kernel_report.py``). Tiles are at least 16 wide: ``tl.dot``'s
    minimum. The state kernel is serial over chunks: narrow Dv blocks give it more programs;
    the output kernel recomputes ``Q K^T`` per Dv block: wide blocks recompute it less."""
    common = dict(DK=dk, DV=dv, BK=max(triton.next_power_of_2(dk), 16), BT=chunk_size)
    width = lambda block: max(min(block, triton.next_power_of_2(dv)), 16)  # noqa: E731
    return dict(
        wy=dict(common, BVU=width(CHUNK_BLOCK_V), SUB=SOLVE_BLOCK),
        state=dict(common, BV=width(CHUNK_BLOCK_V)),
        output=dict(common, BV=width(OUTPUT_BLOCK_V)),
    )


def chunk_table(
    cu_seqlens: torch.Tensor, tokens: int, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each chunk's first token and one past its last, (C,) int32 each, and each sequence's
    first chunk, (N,) int32; on cu_seqlens' device without a host sync: C = cdiv(T,
    chunk_size) + N bounds the count (each sequence adds at most one partial chunk), and
    entries past the real chunks have end == start."""
    n = cu_seqlens.shape[0] - 1
    bound = triton.cdiv(tokens, chunk_size) + n
    cu = cu_seqlens.long()
    lens = cu[1:] - cu[:-1]  # [N]
    counts = (lens + chunk_size - 1) // chunk_size
    chunk_cu = torch.cumsum(counts, 0)  # [N]: chunks through sequence i
    first = chunk_cu - counts  # [N]
    idx = torch.arange(bound, device=cu.device)
    seq = torch.searchsorted(chunk_cu, idx, right=True).clamp_(max=n - 1)  # [C]
    start = cu[seq] + (idx - first[seq]) * chunk_size
    end = torch.minimum(start + chunk_size, cu[seq + 1])
    end = torch.where(idx < chunk_cu[-1], end, start)
    return start.to(torch.int32), end.to(torch.int32), first.to(torch.int32)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    states: torch.Tensor,
    state_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    has_initial_state: torch.Tensor,
    chunk_size: int = 64,
) -> torch.Tensor:
    """The gated delta rule by chunks of ``chunk_size`` tokens (the prefill path); returns o
    (T, H, Dv) in v's dtype and writes each sequence's final state to its slot of ``states``.
    Scratch in fp32: W (T, H, Dk), U (T, H, Dv) and each chunk's starting state (C, H, Dk, Dv)."""
    device = v.device
    check_launchable(device, _chunk_state_kernel)
    n, heads, dk, dv = _check_rule_inputs(q, k, v, g, beta, states, state_indices, cu_seqlens, has_initial_state)
    require(
        chunk_size >= 16 and chunk_size & (chunk_size - 1) == 0,
        f"chunk_size must be a power of two >= 16, got {chunk_size}",
    )
    tokens = v.shape[0]
    o = torch.empty(v.shape, dtype=v.dtype, device=device)
    if n == 0:
        return o
    constexprs = chunk_launch_constexprs(dk, dv, chunk_size)
    chunk_start, chunk_end, first_chunk = chunk_table(cu_seqlens, tokens, chunk_size)
    num_chunks = chunk_start.shape[0]
    w = torch.empty(tokens, heads, dk, dtype=torch.float32, device=device)
    u = torch.empty(tokens, heads, dv, dtype=torch.float32, device=device)
    chunk_states = torch.empty(num_chunks, heads, dk, dv, dtype=torch.float32, device=device)
    if tokens > 0:
        _chunk_wy_kernel[(num_chunks, heads)](
            k,
            v,
            g,
            beta,
            w,
            u,
            chunk_start,
            chunk_end,
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            g.stride(0),
            beta.stride(0),
            w.stride(0),
            w.stride(1),
            u.stride(0),
            u.stride(1),
            num_warps=CHUNK_NUM_WARPS,
            num_stages=1,
            **constexprs["wy"],
        )
    _chunk_state_kernel[(n, heads, triton.cdiv(dv, constexprs["state"]["BV"]))](
        k,
        g,
        w,
        u,
        chunk_states,
        states,
        state_indices,
        cu_seqlens,
        has_initial_state,
        first_chunk,
        k.stride(0),
        k.stride(1),
        g.stride(0),
        w.stride(0),
        w.stride(1),
        u.stride(0),
        u.stride(1),
        chunk_states.stride(0),
        chunk_states.stride(1),
        states.stride(0),
        states.stride(1),
        states.stride(2),
        num_warps=CHUNK_NUM_WARPS,
        num_stages=1,
        **constexprs["state"],
    )
    if tokens > 0:
        _chunk_output_kernel[(num_chunks, heads, triton.cdiv(dv, constexprs["output"]["BV"]))](
            q,
            k,
            g,
            u,
            chunk_states,
            o,
            chunk_start,
            chunk_end,
            scale,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            g.stride(0),
            u.stride(0),
            u.stride(1),
            chunk_states.stride(0),
            chunk_states.stride(1),
            o.stride(0),
            o.stride(1),
            num_warps=CHUNK_NUM_WARPS,
            num_stages=1,
            **constexprs["output"],
        )
    return o
