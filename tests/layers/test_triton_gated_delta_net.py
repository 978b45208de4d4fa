"""The Triton Gated DeltaNet kernels (``layers/ops/triton_gated_delta_net.py``) against
transformers' own Qwen3-Next reference functions: the chunked and recurrent gated delta rule
(``torch_chunk_gated_delta_rule``, ``torch_recurrent_gated_delta_rule``) and the causal conv
(``causal_conv1d_update``), each run per sequence on the [B=1, T, H, D] layout they take.

Packed varlen batches of several sequences (some shorter than a chunk, some crossing several),
initial states for some sequences only, state slots out of order, q/k/v as strided views of
one projection, fp16/bf16 inputs, and a state carried across two calls against one call."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from minivllm.layers.ops.triton_gated_delta_net import (
    causal_conv1d,
    chunk_gated_delta_rule,
    recurrent_gated_delta_rule,
)

hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="CPU runs need TRITON_INTERPRET=1")),
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
    ),
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _tol(dtype: torch.dtype, device: str) -> dict:
    """fp32 in the interpreter is exact fp32; on a GPU the fp32 dots run in TF32; half
    inputs round the outputs."""
    if dtype == torch.float32:
        return dict(atol=2e-5, rtol=2e-5) if device == "cpu" else dict(atol=5e-3, rtol=5e-3)
    return dict(atol=2e-2, rtol=2e-2)


def _rule_inputs(lens, kh, h, dk, dv, dtype, seed=0):
    """q, k, v as strided views of one (T, 2*kh*dk + h*dv) projection, k-heads expanded to the
    h v-heads as the model does (head i reads k-head i // (h // kh)); g, beta fp32. Also the
    unexpanded fp32 q and k the transformers reference takes."""
    gen = torch.Generator().manual_seed(seed)
    t = sum(lens)
    q_small = F.normalize(torch.randn(t, kh, dk, generator=gen), dim=-1)
    k_small = F.normalize(torch.randn(t, kh, dk, generator=gen), dim=-1)
    mixed = torch.cat(
        (q_small.reshape(t, -1), k_small.reshape(t, -1), torch.randn(t, h * dv, generator=gen)), dim=1
    ).to(dtype)
    q_small, k_small = mixed[:, : kh * dk].view(t, kh, dk), mixed[:, kh * dk : 2 * kh * dk].view(t, kh, dk)
    v = mixed[:, 2 * kh * dk :].view(t, h, dv)  # a strided view: token stride 2*kh*dk + h*dv
    q, k = (x.repeat_interleave(h // kh, dim=1) for x in (q_small, k_small))
    g = -torch.rand(t, h, generator=gen) * 0.7  # log-decay <= 0
    beta = torch.rand(t, h, generator=gen)
    return q, k, v, g, beta, q_small.float(), k_small.float()


def _cu(lens) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def _reference(q_small, k_small, v, g, beta, lens, init_states):
    """transformers' recurrent rule per sequence: outputs (T, H, Dv) fp32, final states."""
    outs, finals, cu = [], [], _cu(lens).tolist()
    for i, init in enumerate(init_states):
        s, e = cu[i], cu[i + 1]
        o, final = hf.torch_recurrent_gated_delta_rule(
            q_small[None, s:e],
            k_small[None, s:e],
            v[None, s:e].float(),
            g[None, s:e],
            beta[None, s:e],
            initial_state=None if init is None else init[None],
            output_final_state=True,
            use_qk_l2norm_in_kernel=False,
        )
        outs.append(o[0])
        finals.append(final[0])
    return torch.cat(outs), finals


def _run(kernel, q, k, v, g, beta, states, slots, lens, has_init, device, **extra):
    to = lambda x: x.to(device)  # noqa: E731
    return kernel(
        to(q),
        to(k),
        to(v),
        to(g),
        to(beta),
        scale=q.shape[-1] ** -0.5,
        states=states,
        state_indices=to(slots),
        cu_seqlens=to(_cu(lens)),
        has_initial_state=to(torch.tensor(has_init)),
        **extra,
    )


RULES = [
    pytest.param(chunk_gated_delta_rule, dict(chunk_size=16), id="chunk16"),
    pytest.param(chunk_gated_delta_rule, dict(chunk_size=32), id="chunk32"),  # a solve of two blocks
    pytest.param(recurrent_gated_delta_rule, {}, id="recurrent"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("kernel, extra", RULES)
def test_gated_delta_rule_matches_transformers(kernel, extra, dtype, device):
    """Four sequences (5, 37, 1 and 20 tokens: within, across and at chunk edges of 16 or 32) in slots
    4, 0, 6, 2 of 8, the first and third from their slot's state, the others from zeros; 4
    v-heads over 2 k-heads, Dk 12 (a padded tile) and Dv 24 (two blocks of 16 columns)."""
    lens, slots, has_init = [5, 37, 1, 20], torch.tensor([4, 0, 6, 2]), [True, False, True, False]
    q, k, v, g, beta, q_small, k_small = _rule_inputs(lens, 2, 4, 12, 24, dtype)
    states = torch.randn(8, 4, 12, 24, generator=torch.Generator().manual_seed(1))
    init = [states[s] if flag else None for s, flag in zip(slots.tolist(), has_init)]
    expected, finals = _reference(q_small, k_small, v, g, beta, lens, init)

    got_states = states.to(device)
    o = _run(kernel, q, k, v, g, beta, got_states, slots, lens, has_init, device, **extra)
    assert o.dtype == dtype and o.shape == v.shape
    torch.testing.assert_close(o.float().cpu(), expected, **_tol(dtype, device))
    for slot, final in zip(slots.tolist(), finals):
        torch.testing.assert_close(got_states[slot].cpu(), final, **_tol(dtype, device))
    untouched = [s for s in range(8) if s not in slots.tolist()]
    assert torch.equal(got_states[untouched].cpu(), states[untouched])


@pytest.mark.parametrize("device", DEVICES)
def test_chunk_rule_at_the_default_chunk_size(device):
    """chunk_size 64: one sequence of 70 tokens (a full chunk and a partial one), one of 3."""
    lens, slots = [70, 3], torch.tensor([1, 0])
    q, k, v, g, beta, q_small, k_small = _rule_inputs(lens, 2, 2, 16, 16, torch.float32, seed=2)
    states = torch.randn(2, 2, 16, 16, generator=torch.Generator().manual_seed(3))
    expected, finals = _reference(q_small, k_small, v, g, beta, lens, [states[1], None])
    got_states = states.to(device)
    o = _run(chunk_gated_delta_rule, q, k, v, g, beta, got_states, slots, lens, [True, False], device)
    torch.testing.assert_close(o.cpu(), expected, **_tol(torch.float32, device))
    torch.testing.assert_close(got_states[1].cpu(), finals[0], **_tol(torch.float32, device))
    torch.testing.assert_close(got_states[0].cpu(), finals[1], **_tol(torch.float32, device))


@pytest.mark.parametrize("device", DEVICES)
def test_chunk_rule_is_stable_when_keys_repeat(device):
    """64 tokens whose keys take only two values, beta near 1 and no decay: (I + A) is far from
    the identity (its inverse as a power series in A would cancel catastrophically); the
    chunk of 64 solved by blocks still matches the token-by-token reference."""
    q, k, v, g, beta, q_small, k_small = _rule_inputs([64], 1, 1, 16, 16, torch.float32, seed=15)
    k_small = k_small[torch.arange(64) % 2][:, :1]  # two distinct keys, alternating
    k = k_small.clone()
    beta = torch.full_like(beta, 0.95)
    g = torch.zeros_like(g)
    states = torch.zeros(1, 1, 16, 16)
    expected, finals = _reference(q_small, k_small, v, g, beta, [64], [None])
    got_states = states.to(device)
    o = _run(chunk_gated_delta_rule, q, k, v, g, beta, got_states, torch.tensor([0]), [64], [False], device)
    tol = dict(atol=1e-4, rtol=1e-4) if device == "cpu" else _tol(torch.float32, device)
    torch.testing.assert_close(o.cpu(), expected, **tol)
    torch.testing.assert_close(got_states[0].cpu(), finals[0], **tol)


def test_chunk_rule_matches_transformers_chunked_form():
    """The chunked reference (its own chunks of 16) agrees with ours on one sequence."""
    if not INTERPRETED:
        pytest.skip("CPU runs need TRITON_INTERPRET=1")
    q, k, v, g, beta, q_small, k_small = _rule_inputs([29], 2, 2, 16, 16, torch.float32, seed=4)
    states = torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(5))
    o_ref, final_ref = hf.torch_chunk_gated_delta_rule(
        q_small[None], k_small[None], v[None], g[None], beta[None], chunk_size=16,
        initial_state=states.clone(), output_final_state=True,
    )  # fmt: skip
    got_states = states.clone()
    o = _run(
        chunk_gated_delta_rule, q, k, v, g, beta, got_states, torch.tensor([0]), [29], [True], "cpu", chunk_size=16
    )
    torch.testing.assert_close(o, o_ref[0], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(got_states[0], final_ref[0], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("second", [chunk_gated_delta_rule, recurrent_gated_delta_rule], ids=["chunk", "recurrent"])
def test_state_carried_across_two_calls_equals_one_call(second, device):
    """A chunked prefill of the first part of each sequence, then the rest through ``second``
    (another chunked prefill, or decode steps) from the states the first call wrote: the
    outputs and final states of one call over the whole sequences."""
    lens, split = [23, 4, 18], [17, 1, 16]
    slots, has_init = torch.tensor([2, 0, 1]), [False, True, False]
    q, k, v, g, beta, _, _ = _rule_inputs(lens, 1, 2, 16, 16, torch.float32, seed=6)
    states = torch.randn(3, 2, 16, 16, generator=torch.Generator().manual_seed(7)).to(device)
    cu = _cu(lens).tolist()
    first = torch.cat([torch.arange(cu[i], cu[i] + split[i]) for i in range(3)])
    rest = torch.cat([torch.arange(cu[i] + split[i], cu[i + 1]) for i in range(3)])
    rest_lens = [n - s for n, s in zip(lens, split)]

    whole_states = states.clone()
    whole = _run(chunk_gated_delta_rule, q, k, v, g, beta, whole_states, slots, lens, has_init, device, chunk_size=16)
    parts = [x[first] for x in (q, k, v, g, beta)]
    o1 = _run(chunk_gated_delta_rule, *parts, states, slots, split, has_init, device, chunk_size=16)
    parts = [x[rest] for x in (q, k, v, g, beta)]
    extra = dict(chunk_size=16) if second is chunk_gated_delta_rule else {}
    o2 = _run(second, *parts, states, slots, rest_lens, [True] * 3, device, **extra)
    tol = _tol(torch.float32, device)
    torch.testing.assert_close(o1, whole[first.to(device)], **tol)
    torch.testing.assert_close(o2, whole[rest.to(device)], **tol)
    torch.testing.assert_close(states, whole_states, **tol)


def _conv_reference(x, weight, bias, conv_states, slots, lens, has_init, activation):
    """transformers' ``causal_conv1d_update`` per sequence (its state (1, C, K - 1) updated in
    place): outputs (T, C) fp32 and the new states."""
    outs, new_states, cu = [], [], _cu(lens).tolist()
    for i, (slot, flag) in enumerate(zip(slots.tolist(), has_init)):
        state = conv_states[slot][None].float().clone() if flag else torch.zeros(1, *conv_states.shape[1:])
        xs = x[cu[i] : cu[i + 1]].float().T[None].contiguous()
        outs.append(hf.causal_conv1d_update(xs, state, weight.float(), bias, activation)[0].T)
        new_states.append(state[0])
    return torch.cat(outs), new_states


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("with_bias, activation", [(True, "silu"), (False, None)], ids=["bias-silu", "plain"])
def test_causal_conv1d_matches_transformers(with_bias, activation, dtype, device):
    """Sequences of 1, 2, 19 and 9 tokens (two shorter than the K - 1 = 3 inputs a state holds:
    the new state keeps part of the old one) in slots 3, 0, 5, 1 of 6; 200 channels (two
    blocks, the second partial); the first, second and fourth from their states."""
    lens, slots, has_init = [1, 2, 19, 9], torch.tensor([3, 0, 5, 1]), [True, True, False, True]
    gen = torch.Generator().manual_seed(8)
    channels, width = 200, 4
    x_wide = torch.randn(sum(lens), channels + 8, generator=gen).to(dtype)
    x = x_wide[:, 4 : 4 + channels]  # a strided view, as of a wider projection
    weight = torch.randn(channels, width, generator=gen).to(dtype)
    bias = torch.randn(channels, generator=gen).to(dtype) if with_bias else None
    conv_states = torch.randn(6, channels, width - 1, generator=gen).to(dtype)
    expected, new_states = _conv_reference(
        x, weight, None if bias is None else bias.float(), conv_states, slots, lens, has_init, activation
    )
    got_states = conv_states.to(device)
    y = causal_conv1d(
        x.to(device),
        weight.to(device),
        None if bias is None else bias.to(device),
        conv_states=got_states,
        state_indices=slots.to(device),
        cu_seqlens=_cu(lens).to(device),
        has_initial_state=torch.tensor(has_init, device=device),
        activation=activation,
    )
    assert y.dtype == dtype and y.shape == x.shape
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(y.float().cpu(), expected, **tol)
    for slot, state in zip(slots.tolist(), new_states):
        assert torch.equal(got_states[slot].cpu(), state.to(dtype))  # inputs copied, never rounded twice
    assert torch.equal(got_states[[2, 4]].cpu(), conv_states[[2, 4]])


@pytest.mark.parametrize("device", DEVICES)
def test_causal_conv1d_state_carried_across_two_calls_equals_one_call(device):
    """Each sequence's first tokens, then the rest one call later (decode steps of one token
    for two of them): the outputs and final states of one call."""
    lens, split, slots = [12, 3, 7], [10, 2, 6], torch.tensor([1, 2, 0])
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(sum(lens), 40, generator=gen).to(device)
    weight, bias = torch.randn(40, 4, generator=gen).to(device), torch.randn(40, generator=gen).to(device)
    states = torch.randn(3, 40, 3, generator=gen).to(device)
    cu = _cu(lens).tolist()
    first = torch.cat([torch.arange(cu[i], cu[i] + split[i]) for i in range(3)]).to(device)
    rest = torch.cat([torch.arange(cu[i] + split[i], cu[i + 1]) for i in range(3)]).to(device)

    def call(xs, st, seq_lens, init):
        return causal_conv1d(
            xs,
            weight,
            bias,
            conv_states=st,
            state_indices=slots.to(device),
            cu_seqlens=_cu(seq_lens).to(device),
            has_initial_state=torch.tensor(init, device=device),
        )

    whole_states = states.clone()
    whole = call(x, whole_states, lens, [False, True, False])
    y1 = call(x[first], states, split, [False, True, False])
    y2 = call(x[rest], states, [n - s for n, s in zip(lens, split)], [True] * 3)
    torch.testing.assert_close(y1, whole[first], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y2, whole[rest], atol=1e-5, rtol=1e-5)
    assert torch.equal(states, whole_states)


@pytest.mark.parametrize("device", DEVICES)
def test_a_negative_slot_is_a_padding_entry(device):
    """Slot -1 (a CUDA-graph batch's padding) between two sequences: no state touched (the
    slot before it in memory included), the others' outputs and states as without it."""
    lens, slots, has_init = [6, 1, 5], torch.tensor([1, -1, 0]), [True, True, False]
    keep = torch.tensor([0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 11])  # the padding entry's token is 6
    q, k, v, g, beta, _, _ = _rule_inputs(lens, 1, 2, 16, 16, torch.float32, seed=10)
    states = torch.randn(2, 2, 16, 16, generator=torch.Generator().manual_seed(11)).to(device)
    for kernel, extra in ((chunk_gated_delta_rule, dict(chunk_size=16)), (recurrent_gated_delta_rule, {})):
        padded_states, plain_states = states.clone(), states.clone()
        padded = _run(kernel, q, k, v, g, beta, padded_states, slots, lens, has_init, device, **extra)
        parts = [x[keep] for x in (q, k, v, g, beta)]
        plain = _run(kernel, *parts, plain_states, slots[[0, 2]], [6, 5], [True, False], device, **extra)
        torch.testing.assert_close(padded[keep.to(device)], plain, atol=0, rtol=0)
        assert torch.equal(padded_states, plain_states)
    x = torch.randn(12, 40, generator=torch.Generator().manual_seed(12)).to(device)
    weight = torch.randn(40, 4, generator=torch.Generator().manual_seed(13)).to(device)
    conv_states = torch.randn(2, 40, 3, generator=torch.Generator().manual_seed(14)).to(device)
    outs = []
    for xs, sl, seq_lens, init in (
        (x, slots, lens, has_init),
        (x[keep.to(device)], slots[[0, 2]], [6, 5], [True, False]),
    ):
        st = conv_states.clone()
        outs.append(
            causal_conv1d(
                xs,
                weight,
                None,
                conv_states=st,
                state_indices=sl.to(device),
                cu_seqlens=_cu(seq_lens).to(device),
                has_initial_state=torch.tensor(init, device=device),
            )
        )
        outs.append(st)
    assert torch.equal(outs[0][keep.to(device)], outs[2]) and torch.equal(outs[1], outs[3])


@pytest.mark.skipif(not INTERPRETED, reason="CPU runs need TRITON_INTERPRET=1")
def test_kernels_check_their_arguments():
    q = torch.zeros(3, 2, 8)
    g = torch.zeros(3, 2)
    per_seq = dict(
        state_indices=torch.tensor([0]),
        cu_seqlens=torch.tensor([0, 3], dtype=torch.int32),
        has_initial_state=torch.tensor([False]),
    )
    with pytest.raises(ValueError, match="states must be"):
        recurrent_gated_delta_rule(q, q, q, g, g, scale=1.0, states=torch.zeros(1, 2, 8, 8).half(), **per_seq)
    with pytest.raises(ValueError, match="g must be"):
        chunk_gated_delta_rule(q, q, q, g.double(), g, scale=1.0, states=torch.zeros(1, 2, 8, 8), **per_seq)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_gated_delta_rule(q, q, q, g, g, scale=1.0, states=torch.zeros(1, 2, 8, 8), chunk_size=48, **per_seq)
    with pytest.raises(ValueError, match="2 sequences by cu_seqlens"):
        bad = dict(per_seq, cu_seqlens=torch.tensor([0, 1, 3], dtype=torch.int32))
        recurrent_gated_delta_rule(q, q, q, g, g, scale=1.0, states=torch.zeros(1, 2, 8, 8), **bad)
    x = torch.zeros(3, 8)
    with pytest.raises(ValueError, match="conv_states must be"):
        causal_conv1d(x, torch.zeros(8, 4), None, conv_states=torch.zeros(1, 8, 4), **per_seq)
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d(x, torch.zeros(8, 4), None, conv_states=torch.zeros(1, 8, 3), activation="gelu", **per_seq)


@pytest.mark.skipif(not INTERPRETED, reason="the CPU smoke run needs TRITON_INTERPRET=1")
def test_gated_delta_rule_benchmark_smoke_prints_rows(capsys):
    from tools.kernel_variants import benchmark_module

    assert benchmark_module("gated_delta_rule").main(["--cpu-smoke"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("device cpu, copy") and len(lines) == 6
    assert [line.split()[:4] for line in lines[3:]] == [
        ["decode", "rule", "2", "2"],
        ["decode", "conv", "2", "2"],
        ["prefill", "chunk", "2", "40"],
    ]
