"""Gated DeltaNet's torch ops (``layers/ops/gated_delta_net.py``) against transformers' own
torch implementations (the oracle: ``torch_chunk_gated_delta_rule``,
``torch_recurrent_gated_delta_rule``, ``causal_conv1d_update`` / ``causal_conv1d_fn``), and
against each other: chunked vs recurrent, one pass vs the same tokens split across steps
(the state carried in its slot), packed requests vs one at a time."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from minivllm.layers.ops.gated_delta_net import causal_conv1d, chunk_gated_delta_rule, recurrent_gated_delta_rule

H, DK, DV = 4, 8, 6


def _inputs(T: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(T, H, DK, generator=gen), dim=-1)
    k = F.normalize(torch.randn(T, H, DK, generator=gen), dim=-1)
    v = torch.randn(T, H, DV, generator=gen)
    g = -F.softplus(torch.randn(T, H, generator=gen)) * 0.5
    beta = torch.rand(T, H, generator=gen)
    return q, k, v, g, beta


def _hf_rule(fn, q, k, v, g, beta, init, **kw):
    """One request through transformers' function ((1, L, H, D) layout; it normalises q by
    Dk ** -0.5 itself, and our inputs are already L2-normalised)."""
    out, state = fn(
        q[None], k[None], v[None], g=g[None], beta=beta[None], initial_state=init, output_final_state=True, **kw
    )
    return out[0], state[0]


def _run(fn, q, k, v, g, beta, lens, states, slots, has_init, **kw):
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return fn(
        q,
        k,
        v,
        g,
        beta,
        scale=DK**-0.5,
        states=states,
        state_indices=torch.tensor(slots),
        cu_seqlens=cu,
        has_initial_state=torch.tensor(has_init),
        **kw,
    )


@pytest.mark.parametrize("chunk_size", [4, 64])
@pytest.mark.parametrize("fn", ["chunk", "recurrent"])
def test_matches_transformers_over_packed_requests(fn, chunk_size) -> None:
    """Three requests of 13, 1 and 6 tokens packed, the second and third continuing from a
    state: outputs and final states equal transformers' per request."""
    lens, slots, has_init = [13, 1, 6], [2, 0, 3], [False, True, True]
    q, k, v, g, beta = _inputs(sum(lens))
    states = torch.randn(5, H, DK, DV, generator=torch.Generator().manual_seed(1)) * 0.3
    before = states.clone()
    ours = chunk_gated_delta_rule if fn == "chunk" else recurrent_gated_delta_rule
    kw = {"chunk_size": chunk_size} if fn == "chunk" else {}
    out = _run(ours, q, k, v, g, beta, lens, states, slots, has_init, **kw)
    start = 0
    for n, slot, init in zip(lens, slots, has_init):
        sl = slice(start, start + n)
        init_state = before[slot][None] if init else None
        ref_out, ref_state = _hf_rule(
            hf.torch_chunk_gated_delta_rule, q[sl], k[sl], v[sl], g[sl], beta[sl], init_state, chunk_size=chunk_size
        )
        torch.testing.assert_close(out[sl], ref_out, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(states[slot], ref_state, atol=1e-5, rtol=1e-4)
        start += n
    torch.testing.assert_close(states[[1, 4]], before[[1, 4]], atol=0, rtol=0)  # other slots untouched


def test_recurrent_matches_transformers_recurrent() -> None:
    q, k, v, g, beta = _inputs(5, seed=3)
    states = torch.zeros(1, H, DK, DV)
    out = _run(recurrent_gated_delta_rule, q, k, v, g, beta, [5], states, [0], [False])
    ref_out, ref_state = _hf_rule(hf.torch_recurrent_gated_delta_rule, q, k, v, g, beta, None)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(states[0], ref_state, atol=1e-5, rtol=1e-4)


def test_split_across_steps_equals_one_pass() -> None:
    """A request's 20 tokens in one chunked pass, or as a 7-token chunk, an 8-token chunk
    (chunk size 4: across chunk boundaries) and five decode steps, state carried in its slot."""
    q, k, v, g, beta = _inputs(20, seed=5)
    whole = torch.zeros(2, H, DK, DV)
    ref = _run(chunk_gated_delta_rule, q, k, v, g, beta, [20], whole, [1], [False], chunk_size=4)
    states = torch.zeros(2, H, DK, DV)
    parts = []
    for start, end in [(0, 7), (7, 15)]:
        sl = slice(start, end)
        parts.append(
            _run(
                chunk_gated_delta_rule,
                q[sl],
                k[sl],
                v[sl],
                g[sl],
                beta[sl],
                [end - start],
                states,
                [1],
                [start > 0],
                chunk_size=4,
            )
        )
    for t in range(15, 20):
        sl = slice(t, t + 1)
        parts.append(_run(recurrent_gated_delta_rule, q[sl], k[sl], v[sl], g[sl], beta[sl], [1], states, [1], [True]))
    torch.testing.assert_close(torch.cat(parts), ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(states[1], whole[1], atol=1e-5, rtol=1e-4)


def test_causal_conv1d_matches_transformers() -> None:
    """Prefill (no state) against ``causal_conv1d_fn``; then decode tokens and a continued
    chunk against ``causal_conv1d_update`` with the state transformers keeps (width K; ours K - 1)."""
    gen = torch.Generator().manual_seed(0)
    C, K = 10, 4
    weight, bias = torch.randn(C, K, generator=gen), torch.randn(C, generator=gen)
    x = torch.randn(9 + 1 + 3, C, generator=gen)
    ref_prefill = hf.causal_conv1d_fn(x[:9].T[None], weight, bias, activation="silu")[0].T
    hf_state = F.pad(x[:9].T[None], (K - 9, 0)) if 9 < K else x[:9].T[None, :, -K:].clone()
    conv_states = torch.randn(3, C, K - 1, generator=gen)
    y = causal_conv1d(
        x[:9],
        weight,
        bias,
        conv_states=conv_states,
        state_indices=torch.tensor([2]),
        cu_seqlens=torch.tensor([0, 9], dtype=torch.int32),
        has_initial_state=torch.tensor([False]),
    )
    torch.testing.assert_close(y, ref_prefill, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(conv_states[2], hf_state[0, :, 1:], atol=0, rtol=0)
    # packed: request A continues (1 token, slot 2), request B is new (3 tokens, slot 0)
    before_b = conv_states[0].clone()
    y = causal_conv1d(
        x[9:],
        weight,
        bias,
        conv_states=conv_states,
        state_indices=torch.tensor([2, 0]),
        cu_seqlens=torch.tensor([0, 1, 4], dtype=torch.int32),
        has_initial_state=torch.tensor([True, False]),
    )
    ref_a = hf.causal_conv1d_update(x[9:10].T[None], hf_state, weight, bias, activation="silu")[0].T
    torch.testing.assert_close(y[:1], ref_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(conv_states[2], hf_state[0, :, 1:], atol=0, rtol=0)
    ref_b = hf.causal_conv1d_fn(x[10:].T[None], weight, bias, activation="silu")[0].T
    torch.testing.assert_close(y[1:], ref_b, atol=1e-5, rtol=1e-5)
    assert not torch.equal(conv_states[0], before_b)
    torch.testing.assert_close(conv_states[0], F.pad(x[10:].T, (K - 1 - 3, 0)), atol=0, rtol=0)


def test_causal_conv1d_decode_step_matches_transformers() -> None:
    """A decode-only step (one token a request: no padding), one request continuing and one
    starting from zeros, against ``causal_conv1d_update``."""
    gen = torch.Generator().manual_seed(4)
    C, K = 6, 4
    weight, bias = torch.randn(C, K, generator=gen), torch.randn(C, generator=gen)
    x = torch.randn(2, C, generator=gen)
    conv_states = torch.randn(4, C, K - 1, generator=gen)
    hf_states = [F.pad(conv_states[3], (1, 0))[None].clone(), torch.zeros(1, C, K)]  # slot 3 continues; slot 1 new
    y = causal_conv1d(
        x,
        weight,
        bias,
        conv_states=conv_states,
        state_indices=torch.tensor([3, 1]),
        cu_seqlens=torch.tensor([0, 1, 2], dtype=torch.int32),
        has_initial_state=torch.tensor([True, False]),
    )
    for i, (slot, hf_state) in enumerate(zip([3, 1], hf_states)):
        ref = hf.causal_conv1d_update(x[i : i + 1].T[None], hf_state, weight, bias, activation="silu")[0].T
        torch.testing.assert_close(y[i : i + 1], ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(conv_states[slot], hf_state[0, :, 1:], atol=0, rtol=0)
