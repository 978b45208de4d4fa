"""Gated DeltaNet's ops in torch (Qwen3-Next's linear-attention layers): the short causal
convolution and the gated delta rule, over packed variable-length batches with per-request
state slots. The CPU path and the reference for Triton kernels of the same signatures.

A step's tokens are packed request after request (``cu_seqlens``, as the attention
metadata's ``query_start_loc``); request ``i`` reads and writes its states in slot
``state_indices[i]`` of the layer's state tensors, starting from zeros when
``has_initial_state[i]`` is False (its first chunk) and from the slot otherwise (a later
prefill chunk, a decode step)::

    tokens:       [ a a a a a | b | c c ]         cu_seqlens = [0, 5, 6, 8]
    slots:          3           0   7             state_indices = [3, 0, 7]

**The gated delta rule.** Per head, a state ``S`` (Dk, Dv) evolves token by token::

    S <- exp(g_t) S                              decay (g_t <= 0, log space)
    u_t = beta_t (v_t - S^T k_t)                 the delta: what S mispredicts for k_t
    S <- S + k_t u_t^T                           write the correction
    o_t = S^T (scale q_t)

``recurrent_gated_delta_rule`` runs exactly that (decode: one token a request).
``chunk_gated_delta_rule`` runs the same recurrence a chunk of C tokens at a time with
matmuls. Within a chunk starting from ``S0``, with ``G_t`` the cumulative log decay from the
chunk's start (``Gam_t = exp(G_t)``), the deltas ``U`` (C, Dv) satisfy a unit lower-triangular
system (the WY / UT form)::

    (I + A) U = beta V - (beta Gam K) S0,      A[t, j] = beta_t (k_t . k_j) Gam_t / Gam_j   (j < t)
    O  = (Gam Q) S0 + ((Q K^T) * D) U,         D[t, j] = Gam_t / Gam_j                      (j <= t)
    S_C = Gam_C S0 + (K * Gam_C / Gam)^T U

so ``U = W_v - W_k S0`` with ``W_v = (I + A)^-1 beta V`` and ``W_k = (I + A)^-1 beta Gam K``
(two triangular solves a chunk, for all chunks of all requests at once). Each request is cut
into chunks of its own, the last one padded with ``g = 0``, ``beta = 0`` and ``k = v = q = 0``:
a padded token neither decays nor writes the state, so each request's final state is its last
real token's; only the state's pass from chunk to chunk loops, over the chunks' index, each
iteration taking that chunk of every request long enough to have one. A decode token costs one
chunk of ``C = min(chunk_size, longest request)`` rows, never the longest request's length.

The conv gathers each token's window of K inputs from its request's state inputs and tokens
laid back to back, so it needs no padding either.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _pad_by_sequence(
    tensors: list[torch.Tensor], cu_seqlens: torch.Tensor, multiple: int
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, int]:
    """Packed (T, ...) tensors -> zero-padded (N, L, ...) ones, L the longest request rounded up
    to ``multiple``; also the (T,) request and (T,) position of each packed token, and L."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()  # (N,)
    N, T = lens.shape[0], int(cu_seqlens[-1])
    max_len = int(lens.max()) if N else 0
    L = -(-max_len // multiple) * multiple
    seq = torch.repeat_interleave(torch.arange(N, device=lens.device), lens)  # (T,)
    pos = torch.arange(T, device=lens.device) - cu_seqlens[:-1].long()[seq]  # (T,)
    padded = []
    for x in tensors:
        out = x.new_zeros((N, L, *x.shape[1:]))
        out[seq, pos] = x
        padded.append(out)
    return padded, seq, pos, L


def _chunk_layout(cu_seqlens: torch.Tensor, C: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Each request's tokens in chunks of C of its own (the last one zero-padded), all requests'
    chunks side by side: (T,) chunk and (T,) offset in it of each packed token, (N,) first chunk
    of each request, and each request's chunk count (host ints)."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()  # (N,)
    counts = (lens + C - 1) // C  # (N,)
    first = torch.cumsum(counts, 0) - counts  # (N,)
    seq = torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens)  # (T,)
    pos = torch.arange(seq.shape[0], device=lens.device) - cu_seqlens[:-1].long()[seq]  # (T,)
    return first[seq] + pos // C, pos % C, first, counts.tolist()


def _initial_states(
    states: torch.Tensor, state_indices: torch.Tensor, has_initial_state: torch.Tensor
) -> torch.Tensor:  # (N, H, Dk, Dv) fp32
    init = states[state_indices.long()].float()
    return torch.where(has_initial_state.view(-1, 1, 1, 1), init, torch.zeros_like(init))


def _check(q, k, v, g, beta, states, state_indices, cu_seqlens, has_initial_state) -> None:
    T, H, Dk = q.shape
    Dv = v.shape[-1]
    if k.shape != (T, H, Dk) or v.shape[:2] != (T, H) or g.shape != (T, H) or beta.shape != (T, H):
        raise ValueError(
            f"gated delta rule: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
            f"g {tuple(g.shape)}, beta {tuple(beta.shape)} do not share (T, H)"
        )
    if states.shape[1:] != (H, Dk, Dv) or states.dtype != torch.float32:
        raise ValueError(
            f"gated delta rule: states {tuple(states.shape)} {states.dtype}, expected (slots, {H}, {Dk}, {Dv}) fp32"
        )
    N = cu_seqlens.shape[0] - 1
    if state_indices.shape != (N,) or has_initial_state.shape != (N,):
        raise ValueError(
            f"gated delta rule: {N} sequences, state_indices {tuple(state_indices.shape)}, "
            f"has_initial_state {tuple(has_initial_state.shape)}"
        )


def chunk_gated_delta_rule(
    q: torch.Tensor,  # (T, H, Dk), L2-normalised
    k: torch.Tensor,  # (T, H, Dk), L2-normalised
    v: torch.Tensor,  # (T, H, Dv)
    g: torch.Tensor,  # (T, H) fp32 log decay
    beta: torch.Tensor,  # (T, H) fp32
    *,
    scale: float,
    states: torch.Tensor,  # (num_slots, H, Dk, Dv) fp32, updated in place
    state_indices: torch.Tensor,  # (N,)
    cu_seqlens: torch.Tensor,  # (N + 1,) int32
    has_initial_state: torch.Tensor,  # (N,) bool
    chunk_size: int = 64,
) -> torch.Tensor:  # (T, H, Dv) in v's dtype
    """The gated delta rule over each request's tokens, a chunk of ``chunk_size`` at a time
    (module docstring); each request's final state goes to its slot."""
    _check(q, k, v, g, beta, states, state_indices, cu_seqlens, has_initial_state)
    T, H, Dk = q.shape
    Dv = v.shape[-1]
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    C = max(1, min(chunk_size, int(lens.max()) if lens.numel() else 1))
    chunk, offset, first, counts = _chunk_layout(cu_seqlens, C)
    M = sum(counts)  # chunks of all requests
    # (M, H, C, D) and (M, H, C): every chunk of every request, zero-padded
    qc, kc, vc = (_to_chunks(x.float(), chunk, offset, M, C) for x in (q * scale, k, v))
    gc, bc = (_to_chunks(x.float().unsqueeze(-1), chunk, offset, M, C).squeeze(-1) for x in (g, beta))
    G = gc.cumsum(-1)  # (M, H, C): log decay from the chunk's start, inclusive
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    D = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(~lower, float("-inf")).exp()  # (M, H, C, C) Gam_t / Gam_j
    I_plus_A = (bc.unsqueeze(-1) * (kc @ kc.transpose(-1, -2)) * D).tril(-1) + torch.eye(C, device=q.device)
    Wv = torch.linalg.solve_triangular(I_plus_A, bc.unsqueeze(-1) * vc, upper=False, unitriangular=True)
    Wk = torch.linalg.solve_triangular(I_plus_A, (bc * G.exp()).unsqueeze(-1) * kc, upper=False, unitriangular=True)
    attn = (qc @ kc.transpose(-1, -2)) * D  # (M, H, C, C), zero above the diagonal
    qg = qc * G.exp().unsqueeze(-1)  # (M, H, C, Dk)
    tail = ((G[..., -1:] - G).exp().unsqueeze(-1) * kc).transpose(-1, -2)  # (M, H, Dk, C): k_j Gam_C / Gam_j
    decay = G[..., -1].exp()[..., None, None]  # (M, H, 1, 1)
    S = _initial_states(states, state_indices, has_initial_state)  # (N, H, Dk, Dv)
    out = torch.empty(M, H, C, Dv, dtype=torch.float32, device=q.device)
    counts_t = torch.tensor(counts, device=q.device)
    for c in range(max(counts, default=0)):  # chunk c of every request that has one, together
        active = None if min(counts) > c else (counts_t > c).nonzero().squeeze(-1)  # None: every request
        idx = first + c if active is None else first[active] + c
        S_a = S if active is None else S[active]
        U = Wv[idx] - Wk[idx] @ S_a  # (n, H, C, Dv)
        out[idx] = qg[idx] @ S_a + attn[idx] @ U
        S_new = decay[idx] * S_a + tail[idx] @ U
        if active is None:
            S = S_new
        else:
            S[active] = S_new
    states[state_indices.long()] = S
    return out.permute(0, 2, 1, 3)[chunk, offset].to(v.dtype)  # (T, H, Dv)


def _to_chunks(x: torch.Tensor, chunk: torch.Tensor, offset: torch.Tensor, M: int, C: int) -> torch.Tensor:
    """Packed (T, H, D) -> (M, H, C, D), each token at its chunk and offset, zeros elsewhere."""
    out = x.new_zeros((M, C, *x.shape[1:]))
    out[chunk, offset] = x
    return out.transpose(1, 2)


def recurrent_gated_delta_rule(
    q: torch.Tensor,  # (T, H, Dk), L2-normalised
    k: torch.Tensor,  # (T, H, Dk), L2-normalised
    v: torch.Tensor,  # (T, H, Dv)
    g: torch.Tensor,  # (T, H) fp32 log decay
    beta: torch.Tensor,  # (T, H) fp32
    *,
    scale: float,
    states: torch.Tensor,  # (num_slots, H, Dk, Dv) fp32, updated in place
    state_indices: torch.Tensor,  # (N,)
    cu_seqlens: torch.Tensor,  # (N + 1,) int32
    has_initial_state: torch.Tensor,  # (N,) bool
) -> torch.Tensor:  # (T, H, Dv) in v's dtype
    """The gated delta rule token by token (the decode form; module docstring), all requests at once."""
    _check(q, k, v, g, beta, states, state_indices, cu_seqlens, has_initial_state)
    f32 = [x.float() for x in (q, k, v, g, beta)]
    f32[0] = f32[0] * scale
    if cu_seqlens.shape[0] - 1 == q.shape[0]:  # one token a request (decode): no padding
        qp, kp, vp, gp, bp = (x.unsqueeze(1) for x in f32)
        seq = pos = None
    else:
        (qp, kp, vp, gp, bp), seq, pos, _ = _pad_by_sequence(f32, cu_seqlens, 1)
    S = _initial_states(states, state_indices, has_initial_state)  # (N, H, Dk, Dv)
    outs = []
    for t in range(qp.shape[1]):
        S = S * gp[:, t].exp()[..., None, None]
        u = bp[:, t, :, None] * (vp[:, t] - (S * kp[:, t, :, :, None]).sum(-2))  # (N, H, Dv)
        S = S + kp[:, t, :, :, None] * u[:, :, None, :]
        outs.append((S * qp[:, t, :, :, None]).sum(-2))  # (N, H, Dv)
    states[state_indices.long()] = S
    out = torch.stack(outs, dim=1)  # (N, L, H, Dv)
    out = out[:, 0] if seq is None else out[seq, pos]
    return out.to(v.dtype)


def causal_conv1d(
    x: torch.Tensor,  # (T, C)
    weight: torch.Tensor,  # (C, K)
    bias: torch.Tensor | None,  # (C,)
    *,
    conv_states: torch.Tensor,  # (num_slots, C, K - 1), updated in place
    state_indices: torch.Tensor,  # (N,)
    cu_seqlens: torch.Tensor,  # (N + 1,) int32
    has_initial_state: torch.Tensor,  # (N,) bool
    activation: str | None = "silu",
) -> torch.Tensor:  # (T, C) in x's dtype
    """A depthwise causal convolution of width K over each request's tokens, preceded by the
    request's last K - 1 inputs (its conv state; zeros when ``has_initial_state`` is False).
    Each request's last K - 1 inputs (state and tokens together) go back to its slot."""
    T, C = x.shape
    K = weight.shape[1]
    if weight.shape != (C, K) or conv_states.shape[1:] != (C, K - 1):
        raise ValueError(
            f"causal_conv1d: x {tuple(x.shape)}, weight {tuple(weight.shape)}, "
            f"conv_states {tuple(conv_states.shape)}: expected (T, C), (C, K), (slots, C, K - 1)"
        )
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"causal_conv1d: activation={activation!r}; supported: silu, None")
    idx = state_indices.long()
    prefix = conv_states[idx].to(weight.dtype)  # (N, C, K - 1)
    prefix = torch.where(has_initial_state.view(-1, 1, 1), prefix, torch.zeros_like(prefix))
    if idx.shape[0] == T:  # one token a request (decode): no padding
        window = torch.cat((prefix, x.to(weight.dtype).unsqueeze(-1)), dim=-1)  # (N, C, K)
        conv_states[idx] = window[:, :, 1:].to(conv_states.dtype)
        y = (window * weight).sum(-1) if bias is None else (window * weight).sum(-1) + bias  # (T, C)
        return (F.silu(y) if activation is not None else y).to(x.dtype)
    # Each request's K - 1 state inputs then its tokens, requests back to back: (T + N (K - 1), C)
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()  # (N,)
    N = lens.shape[0]
    seg_start = cu_seqlens[:-1].long() + torch.arange(N, device=x.device) * (K - 1)  # (N,) first row of each
    seq = torch.repeat_interleave(torch.arange(N, device=x.device), lens)  # (T,)
    rows = seg_start[seq] + torch.arange(T, device=x.device) - cu_seqlens[:-1].long()[seq]  # (T,) window starts
    ext = x.new_empty((T + N * (K - 1), C), dtype=weight.dtype)
    state_rows = seg_start.unsqueeze(1) + torch.arange(K - 1, device=x.device)  # (N, K - 1)
    ext[state_rows] = prefix.transpose(1, 2)
    ext[rows + K - 1] = x.to(weight.dtype)
    y = torch.einsum("tkc,ck->tc", ext[rows.unsqueeze(1) + torch.arange(K, device=x.device)], weight)  # (T, C)
    if bias is not None:
        y = y + bias
    conv_states[idx] = ext[state_rows + lens.unsqueeze(1)].transpose(1, 2).to(conv_states.dtype)
    if activation is not None:
        y = F.silu(y)
    return y.to(x.dtype)
