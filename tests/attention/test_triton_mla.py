"""The Triton MLA decode kernel against the torch absorbed form, and the Triton backend's
MLA path inside the engine (decode steps on the kernel) against the torch backend."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.attention.kv_quant import FP8_KV_DTYPE
from minivllm.attention.mla import MLAPlan, _absorbed, gather_latent, write_latent
from minivllm.attention.ops import triton_kv_write
from minivllm.attention.ops.triton_mla_decode import mla_decode
from minivllm.attention.ops.triton_mla_prefill import mla_prefill
from tests.model_configs import deepseek_v3_config

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="CPU runs need TRITON_INTERPRET=1")),
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_dtype", [torch.float32, FP8_KV_DTYPE], ids=["fp32", "fp8"])
def test_triton_latent_write_matches_torch(kv_dtype, device):
    """The Triton latent write (what captured decode steps store with) leaves the torch write's
    bytes: padding slots (-1) skipped, an fp8 cache holding latent / k_scale."""
    gen = torch.Generator().manual_seed(3)
    latent = torch.randn(6, 24, generator=gen) * 3
    slots = torch.tensor([5, -1, 17, 2, -1, 30])
    want = torch.full((8, 4, 1, 24), 0.25).to(kv_dtype)
    write_latent(latent, want, slots, k_scale=0.5)
    got = torch.full((8, 4, 1, 24), 0.25).to(kv_dtype).to(device)
    triton_kv_write.write_latent(latent.to(device), got, slots.to(device), k_scale=0.5)
    caches = {False: want, True: got.cpu()}
    assert torch.equal(caches[True].view(torch.uint8), caches[False].view(torch.uint8))
    assert caches[True].view(-1, 24)[[0, 1, 3, 4]].float().eq(0.25).all()  # untouched slots
    with pytest.raises(ValueError, match="latent cache"):
        triton_kv_write.write_latent(latent.to(device), torch.zeros(8, 4, 2, 12, device=device), slots.to(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_dtype", [torch.float32, FP8_KV_DTYPE], ids=["fp32", "fp8"])
def test_mla_decode_kernel_matches_absorbed_torch(kv_dtype, device):
    """Three requests of 9, 3 and 21 tokens over shuffled blocks of 4 (the kernel's 16-position
    tiles cross block boundaries), 5 heads (a partial head block), latent 16 + rope 8."""
    H, dn, dv, r, dr, block_size = 5, 16, 12, 16, 8, 4
    gen = torch.Generator().manual_seed(0)
    seq_lens = torch.tensor([9, 3, 21], dtype=torch.int32)
    tables = torch.randperm(24, generator=gen)[:18].view(3, 6).int()
    cache = torch.zeros(24, block_size, 1, r + dr, dtype=kv_dtype)
    for i, n in enumerate(seq_lens.tolist()):
        slots = torch.tensor([int(tables[i, p // block_size]) * block_size + p % block_size for p in range(n)])
        write_latent(torch.randn(n, r + dr, generator=gen), cache, slots, k_scale=0.5)
    q_nope, q_pe = torch.randn(3, 1, H, dn, generator=gen), torch.randn(3, 1, H, dr, generator=gen)
    w_uk, w_uv = torch.randn(H, dn, r, generator=gen) / 4, torch.randn(H, dv, r, generator=gen) / 4

    lat = gather_latent(cache, tables.long(), torch.float32, 0.5)  # (3, 24, r + dr)
    expected = _absorbed(q_nope, q_pe, lat, (seq_lens.long() - 1).view(3, 1), w_uk, w_uv, 0.3).squeeze(1)

    q = torch.cat((torch.einsum("bhd,hdr->bhr", q_nope[:, 0], w_uk), q_pe[:, 0]), dim=-1).to(device)
    o_lat = mla_decode(
        q, cache.to(device), tables.to(device), seq_lens.to(device), kv_lora_rank=r, scale=0.3, k_scale=0.5
    )
    got = torch.einsum("bhr,hvr->bhv", o_lat.cpu(), w_uv)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mla_prefill_kernel_matches_torch(dtype, device):
    """Three prefill requests (n queries, the last of L positions): a 5-token chunk after 6 cached
    tokens, a whole 3-token prompt, a 40-token chunk after 5 (two query tiles of 32, the second
    partly empty); 3 heads, nope 16 + rope 8 (shared by the heads), value width 12 (padded to 16)."""
    from minivllm.attention.mla import varlen_attention

    H, dn, dr, dv = 3, 16, 8, 12
    lens = ((5, 11), (3, 3), (40, 45))
    gen = torch.Generator().manual_seed(1)
    Tq, Lk = sum(n for n, _ in lens), sum(length for _, length in lens)
    q_nope, q_pe = torch.randn(Tq, H, dn, generator=gen), torch.randn(Tq, H, dr, generator=gen)
    k_nope, k_pe, v = (
        torch.randn(Lk, H, dn, generator=gen),
        torch.randn(Lk, dr, generator=gen),
        torch.randn(Lk, H, dv, generator=gen),
    )
    inputs = [t.to(dtype) for t in (q_nope, q_pe, k_nope, k_pe, v)]
    expected = varlen_attention(*[t.float() for t in inputs], lens, 0.25)
    cu_q = torch.tensor([0, 5, 8, 48], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 11, 14, 59], dtype=torch.int32, device=device)
    got = mla_prefill(*[t.to(device) for t in inputs], cu_q, cu_k, max_query_len=40, scale=0.25)
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float().cpu(), expected, atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="do not agree"):
        mla_prefill(
            *[t.to(device) for t in inputs[:4]], inputs[4][:, :2].to(device), cu_q, cu_k, max_query_len=40, scale=0.25
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "all-visible"])
def test_mla_prefill_kernel_log_sum_exp(causal, device):
    """The kernel's log-sum-exp rows (natural log, fp32) and, with ``causal=False``, every key
    visible to every query: three requests, one of them with no key (its rows' LSE is -inf)."""
    H, dn, dr, dv = 3, 16, 8, 12
    lens = ((5, 11), (3, 0 if not causal else 3), (40, 45))
    gen = torch.Generator().manual_seed(2)
    Tq, Lk = sum(n for n, _ in lens), sum(length for _, length in lens)
    q_nope, q_pe = torch.randn(Tq, H, dn, generator=gen), torch.randn(Tq, H, dr, generator=gen)
    k_nope, k_pe = torch.randn(Lk, H, dn, generator=gen), torch.randn(Lk, dr, generator=gen)
    v = torch.randn(Lk, H, dv, generator=gen)
    want_out, want_lse, q0, k0 = [], [], 0, 0
    for n, length in lens:
        q = torch.cat((q_nope[q0 : q0 + n], q_pe[q0 : q0 + n]), -1).transpose(0, 1)  # (H, n, dn + dr)
        k = torch.cat((k_nope[k0 : k0 + length], k_pe[k0 : k0 + length].expand(H, -1, -1).transpose(0, 1)), -1)
        s = q @ k.permute(1, 2, 0) * 0.25  # (H, n, L)
        if causal:
            s = s.masked_fill(
                torch.arange(length).view(1, -1) > torch.arange(length - n, length).view(-1, 1), -torch.inf
            )
        lse = torch.logsumexp(s, -1)  # (H, n)
        p = torch.exp(s - lse.nan_to_num(neginf=0.0).unsqueeze(-1))
        want_out.append((p @ v[k0 : k0 + length].transpose(0, 1)).transpose(0, 1))
        want_lse.append(lse.transpose(0, 1))
        q0, k0 = q0 + n, k0 + length
    cu_q = torch.tensor([0, 5, 8, 48], dtype=torch.int32, device=device)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum([length for _, length in lens])]), dtype=torch.int32)
    inputs = [t.to(device) for t in (q_nope, q_pe, k_nope, k_pe, v)]
    out, lse = mla_prefill(*inputs, cu_q, cu_k.to(device), max_query_len=40, scale=0.25, causal=causal, return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == (Tq, H)
    torch.testing.assert_close(out.cpu(), torch.cat(want_out), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.cpu(), torch.cat(want_lse), atol=1e-5, rtol=1e-5)
    if not causal:
        assert lse[5:8].eq(-torch.inf).all() and out[5:8].eq(0).all()  # no key: -inf and a zero output


def test_mla_decode_checks_its_arguments():
    q = torch.zeros(2, 4, 24)
    with pytest.raises(ValueError, match="not a latent cache"):
        mla_decode(
            q,
            torch.zeros(4, 4, 2, 24),
            torch.zeros(2, 1, dtype=torch.int32),
            torch.ones(2, dtype=torch.int32),
            kv_lora_rank=16,
            scale=1.0,
        )
    with pytest.raises(ValueError, match="kv_lora_rank=24"):
        mla_decode(
            q,
            torch.zeros(4, 4, 1, 24),
            torch.zeros(2, 1, dtype=torch.int32),
            torch.ones(2, dtype=torch.int32),
            kv_lora_rank=24,
            scale=1.0,
        )


@pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(), reason="needs TRITON_INTERPRET=1 or CUDA")
def test_triton_backend_runs_deepseek_like_torch(make_checkpoint):
    ckpt = make_checkpoint("deepseek-v3-mla-yarn-grouped-sigmoid-router", deepseek_v3_config())
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=0)
    prompts = [{"prompt_token_ids": list(range(10, 10 + n))} for n in (3, 11)]
    results = {}
    for backend in ("torch", "triton"):
        llm = LLM(model=str(ckpt), dtype="float32", block_size=8, num_gpu_blocks_override=16, attention_backend=backend)
        try:
            results[backend] = llm.generate(prompts, params, use_tqdm=False)
        finally:
            llm.shutdown()
    for a, b in zip(results["torch"], results["triton"]):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for lp_a, lp_b, t in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, a.outputs[0].token_ids):
            assert abs(lp_a[t] - lp_b[t]) < 1e-4


@pytest.mark.skipif(not INTERPRETED, reason="the CPU smoke run needs TRITON_INTERPRET=1")
def test_mla_decode_benchmark_smoke_prints_a_row(capsys):
    from tools.kernel_variants import benchmark_module

    assert benchmark_module("mla_decode").main(["--cpu-smoke"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("device cpu, copy") and len(lines) == 3
    assert lines[2].split()[:3] == ["4", "2", "40"]  # heads, batch, context


def _mixed_inputs(kv_dtype=torch.float32, pad: int = 0, **lens):
    """``_mixed_step``'s three requests (a 5-token chunk after 6 cached tokens, decode tokens at 9
    and 3, unless ``lens`` says otherwise), ``pad`` padding tokens after them, 4 heads."""
    from tests.models.test_deepseek_mla import _mixed_step

    H, dn, dv, r, dr = 4, 16, 12, 16, 8
    cache, meta, _, gen = _mixed_step(r=r, dr=dr, dtype=kv_dtype, k_scale=0.5, **lens)
    if pad:
        meta.slot_mapping = torch.cat((meta.slot_mapping, torch.full((pad,), -1)))
        meta.has_padding = True
    T = meta.num_tokens
    q_nope, q_pe = torch.randn(T, H, dn, generator=gen), torch.randn(T, H, dr, generator=gen)
    new = torch.randn(T, r + dr, generator=gen)
    w_uk, w_uv = torch.randn(H, dn, r, generator=gen) / 4, torch.randn(H, dv, r, generator=gen) / 4
    return cache, meta, (q_nope, q_pe, new), dict(w_uk=w_uk, w_uv=w_uv, scale=0.3, k_scale=0.5)


@pytest.mark.skipif(not INTERPRETED, reason="the Triton backend on the CPU needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("kv_dtype", [torch.float32, FP8_KV_DTYPE], ids=["fp32", "fp8"])
@pytest.mark.parametrize("pad", [0, 2])
def test_triton_backend_mixed_step_matches_torch(kv_dtype, pad):
    """A step holding a prefill chunk and two decode tokens (and padding rows): the Triton backend
    sends the decode rows to the latent kernel and the chunk's rows to the expanded form over its
    cached and new latents; the torch backend's result and cache, row for row."""
    from minivllm.attention.mla import mla_attention
    from minivllm.attention.triton_backend import TritonAttentionBackend

    outs, caches = [], []
    for triton_backend in (False, True):
        cache, meta, (q_nope, q_pe, new), kw = _mixed_inputs(kv_dtype, pad)
        if triton_backend:
            out = TritonAttentionBackend().forward_mla(q_nope, q_pe, new, cache, meta, **kw)
            plan = meta.mla_plan
            assert plan.varlen and plan.decode_reqs.tolist() == [1, 2] and plan.prefill_lens == ((5, 11),)
        else:
            out = mla_attention(q_nope, q_pe, new, cache, meta, **kw)
        outs.append(out[: meta.num_tokens - pad])
        caches.append(cache.view(torch.uint8))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    assert torch.equal(caches[1], caches[0])


@pytest.mark.skipif(not INTERPRETED, reason="the Triton backend on the CPU needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("kv_dtype", [torch.float32, FP8_KV_DTYPE], ids=["fp32", "fp8"])
@pytest.mark.parametrize("piece", [1, 4, 7, 64])
def test_triton_backend_context_in_pieces_equals_the_whole_context(piece, kv_dtype, monkeypatch):
    """Two prefill chunks (5 tokens after 6 cached, 4 after 9) beside a decode token: the Triton
    backend expands their 15 context positions ``piece`` at a time (pieces that cut across the
    two requests; 4 and 7 divide neither) and merges by log-sum-exp; the torch backend's output
    with the whole context expanded at once."""
    from minivllm.attention import mla
    from minivllm.attention.triton_backend import TritonAttentionBackend

    lens = dict(query_lens=(5, 1, 4), seq_lens=(11, 9, 13))
    cache, meta, (q_nope, q_pe, new), kw = _mixed_inputs(kv_dtype, **lens)
    want = mla.mla_attention(q_nope, q_pe, new, cache, meta, **kw)  # one piece: 8192 positions
    monkeypatch.setattr(mla, "CONTEXT_CHUNK_TOKENS", piece)
    cache, meta, (q_nope, q_pe, new), kw = _mixed_inputs(kv_dtype, **lens)
    got = TritonAttentionBackend().forward_mla(q_nope, q_pe, new, cache, meta, **kw)
    plan = meta.mla_plan
    assert plan.prefill_lens == ((5, 11), (4, 13)) and plan.prefill_ctx_slots.shape == (15,)
    assert [(first, end) for first, end, _ in plan.prefill_pieces] == [
        (i, min(i + piece, 15)) for i in range(0, 15, piece)
    ]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not INTERPRETED, reason="the Triton backend on the CPU needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("case", ["chunked-async", "prefix-cache", "prefix-cache-pieces"])
def test_triton_backend_mixed_steps_match_transformers(case, make_checkpoint, monkeypatch):
    """The Triton backend's MLA under mixed steps, against transformers: a 4-token budget cuts the
    prompts into chunks that run beside other requests' decode tokens (async scheduling); or four
    prompts share a 16-token head, so later prefills read it from cached blocks (the expanded form
    over context they did not compute) while earlier requests decode; or, with 8-token chunks, a
    5-position context piece and async scheduling, that context is expanded piece by piece."""
    from minivllm.attention import mla
    from tests.models.test_deepseek_mla import _assert_matches_transformers, _generate, _prompts

    ckpt = make_checkpoint("deepseek-v3-mla-yarn-grouped-sigmoid-router", deepseek_v3_config())
    if case == "chunked-async":
        prompts = _prompts()
        kwargs = dict(max_num_batched_tokens=4, max_num_seqs=4, max_model_len=64, async_scheduling=True)
    else:
        prompts = _prompts(shared_prefix=16)
        kwargs = dict(enable_prefix_caching=True, max_num_batched_tokens=24, max_num_seqs=4)
    if case == "prefix-cache-pieces":
        monkeypatch.setattr(mla, "CONTEXT_CHUNK_TOKENS", 5)
        kwargs.update(max_num_batched_tokens=8, async_scheduling=True)
    steps = []
    original = MLAPlan.build.__func__

    def build(cls, meta, *args, **kw):
        plan = original(cls, meta, *args, **kw)
        steps.append((plan.decode_tokens is not None, plan.prefill_lens, len(plan.prefill_pieces)))
        return plan

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MLAPlan, "build", classmethod(build))
        outs, stats = _generate(ckpt, prompts, attention_backend="triton", **kwargs)
    assert any(decodes and prefills for decodes, prefills, _ in steps)  # mixed steps happened
    if case != "chunked-async":
        assert stats.prefix_cache_hits > 0
        assert any(length - n >= 16 for _, prefills, _ in steps for n, length in prefills)  # context from the cache
    if case == "prefix-cache-pieces":
        assert max(pieces for *_, pieces in steps) >= 4  # 16 context positions or more, 5 at a time
    _assert_matches_transformers(ckpt, prompts, outs)


@pytest.mark.skipif(not INTERPRETED, reason="the Triton backend on the CPU needs TRITON_INTERPRET=1")
def test_triton_backend_verify_steps_match_transformers(make_checkpoint):
    """n-gram speculation's verify steps (a running request's token and its drafts, several queries
    at the end of its context: the expanded form) on the Triton backend give transformers' greedy
    tokens. Drafts are made only for requests without logprobs; one-token lookups find matches in
    a random model's output."""
    from tests.models.test_deepseek_mla import _prompts, assert_greedy_tokens

    ckpt = make_checkpoint("deepseek-v3-mla-yarn-grouped-sigmoid-router", deepseek_v3_config())
    prompts = [p * 3 for p in _prompts()]
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    llm = LLM(
        model=str(ckpt),
        dtype="float32",
        block_size=8,
        num_gpu_blocks_override=64,
        max_model_len=128,
        attention_backend="triton",
        speculative_config=spec,
    )
    try:
        params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        stats = llm.llm_engine.scheduler_stats()
    finally:
        llm.shutdown()
    assert stats.spec_num_draft_tokens > 0
    assert_greedy_tokens(ckpt, prompts, [list(o.outputs[0].token_ids) for o in outs])


@pytest.mark.skipif(not INTERPRETED, reason="the CPU smoke run needs TRITON_INTERPRET=1")
def test_mla_prefill_benchmark_smoke_prints_a_row(capsys):
    from tools.kernel_variants import benchmark_module

    assert benchmark_module("mla_decode").main(["--cpu-smoke", "--prefill"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["heads", "chunk", "context", "kernel", "us", "torch", "us", "TFLOP/s"]
    assert len(lines) == 3 and lines[2].split()[:3] == ["4", "8", "40"]


@pytest.mark.slow
@pytest.mark.skipif(not INTERPRETED, reason="the Triton backend on the CPU needs TRITON_INTERPRET=1")
def test_triton_backend_tp2_chunked_matches_tp1(make_checkpoint):
    """tp=2 on the Triton backend (each rank its heads over the replicated latent cache), prompts cut
    into 8-token chunks beside decodes: tp=1's torch-backend tokens and logprobs."""
    from tests.executor import tp_helpers as h

    ckpt = make_checkpoint("deepseek-v3-mla-yarn-grouped-sigmoid-router", deepseek_v3_config())
    kwargs = dict(h.LLM_KWARGS, max_num_batched_tokens=8)
    llm = LLM(model=str(ckpt), tensor_parallel_size=2, attention_backend="triton", **kwargs)
    try:
        h.assert_same_outputs(h.reference(ckpt), h.generate(llm))
    finally:
        llm.shutdown()
