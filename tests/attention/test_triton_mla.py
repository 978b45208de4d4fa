"""The Triton MLA decode kernel against the torch absorbed form, and the Triton backend's
MLA path inside the engine (decode steps on the kernel) against the torch backend."""

from __future__ import annotations

import os

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.attention.kv_quant import FP8_KV_DTYPE
from minivllm.attention.mla import _absorbed, gather_latent, write_latent
from minivllm.attention.ops import triton_kv_write
from minivllm.attention.ops.triton_mla_decode import mla_decode
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
