"""The fused-MoE kernel's tile configs: each family (and the GROUP_M swizzle) against the torch
loop over experts (interpreter on the CPU), and the heuristic's rules."""

from __future__ import annotations

import os

import pytest
import torch

from minivllm.layers.fused_moe import route, torch_fused_experts
from minivllm.layers.fused_moe.tiles import MoeTiles, expert_kind, heuristic_tiles, tune_candidates
from minivllm.layers.fused_moe.triton_experts import triton_fused_experts

DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU runs need TRITON_INTERPRET=1"),
    ),
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
    ),
]

# (tokens, experts, top_k, hidden, intermediate, tiles): every family the heuristic has, at tiny sizes
CASES = [
    (3, 8, 2, 48, 40, MoeTiles(16, 64, 128)),  # decode: a K step wider than K
    # 20 row blocks with work (of 21): swizzle groups of 8, 8 and a tail of 5, 4 of them with work
    (150, 2, 2, 32, 24, MoeTiles(16, 32, 32, group_m=8)),
    (50, 4, 2, 32, 48, MoeTiles(32, 64, 64, group_m=8)),
    (90, 4, 2, 40, 72, MoeTiles(64, 128, 64, group_m=8)),  # N = 144 and 40: masked column tails
    (300, 2, 2, 32, 16, MoeTiles(128, 128, 64, group_m=8, num_warps=8)),
    # the few-large-experts families: K steps of 256 at decode, 128-wide N and K, 256-wide N
    (5, 4, 2, 64, 136, MoeTiles(16, 64, 256)),  # K = 272 for the down GEMM: a short last step
    (40, 4, 2, 48, 80, MoeTiles(32, 128, 128, group_m=4)),
    (260, 2, 2, 32, 24, MoeTiles(128, 256, 64, group_m=8, num_warps=8)),
    # the down GEMM split along I: 4 splits of 32 (I = 128), 3 of 64 + 64 + 16 (I = 144, a short last)
    (3, 8, 2, 48, 128, MoeTiles(16, 32, 32, split_k=4)),
    (6, 4, 2, 40, 144, MoeTiles(16, 64, 64, split_k=3)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T, E, k, H, I, tiles", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_every_tile_family_matches_the_torch_loop(device, T, E, k, H, I, tiles):
    gen = torch.Generator().manual_seed(T)
    hidden = torch.randn(T, H, generator=gen)
    w13 = torch.randn(E, 2 * I, H, generator=gen) / H**0.5
    w2 = torch.randn(E, H, I, generator=gen) / I**0.5
    weights, ids = route(torch.randn(T, E, generator=gen) * 3, k, renormalize=True)
    expected = torch_fused_experts(hidden, w13, w2, weights, ids)
    actual = triton_fused_experts(*(t.to(device) for t in (hidden, w13, w2, weights, ids)), tiles=tiles).cpu()
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("tokens", [1, 64, 1024])
def test_heuristic_tiles_in_bf16_on_cuda(tokens):
    """The compiled bf16 path (tensor-core dots) with the heuristic's pick, against the fp32 loop."""
    gen = torch.Generator().manual_seed(tokens)
    E, k, H, I = 8, 2, 256, 512
    hidden = torch.randn(tokens, H, generator=gen)
    w13, w2 = torch.randn(E, 2 * I, H, generator=gen) / H**0.5, torch.randn(E, H, I, generator=gen) / I**0.5
    weights, ids = route(torch.randn(tokens, E, generator=gen), k, renormalize=True)
    expected = torch_fused_experts(hidden, w13, w2, weights, ids)
    bf16 = [
        t.cuda().to(torch.bfloat16) if t.is_floating_point() and t is not weights else t.cuda()
        for t in (hidden, w13, w2, weights, ids)
    ]
    actual = triton_fused_experts(*bf16).float().cpu()
    assert (actual - expected).abs().max() <= 3e-2 * expected.abs().max()


SHAPES = [(128, 8, 2048), (8, 2, 4096)]  # (experts, top_k, hidden): Qwen3-30B-A3B and Mixtral-8x7B
SHARED = {80: 166912, 90: 232448}  # bytes of shared memory a block may use (tools/kernel_report.py)


@pytest.mark.parametrize("E, k, H", SHAPES)
def test_row_blocks_follow_the_rows_each_expert_gets(E, k, H):
    tokens = [1, 8, 64, 256, 1024, 4096, 16384]
    for arch in (80, 90):
        picks = [heuristic_tiles(t, E, k, arch, H) for t in tokens]
        assert [p.block_m for p in picks] == sorted(p.block_m for p in picks)  # never smaller for more tokens
        for t, p in zip(tokens, picks):
            rows = t * k / E
            assert p.block_m <= max(16, 2 * rows)  # padding stays under half a block per expert
            assert p.num_stages == 3 if arch < 90 else p.num_stages in (3, 4)
            stage_bytes = 2 * (p.block_m * p.block_k + p.block_k * p.block_n)  # bf16 A and W tiles
            assert p.num_stages * stage_bytes <= SHARED[arch]
            assert (p.group_m == 1) == (rows <= 16)  # no swizzle at decode: one row block per expert
        assert picks[-1].block_m * picks[-1].block_n >= 8 * picks[0].block_m * picks[0].block_n


def test_few_large_experts_get_their_own_wider_tiles():
    """Mixtral's 8 experts of hidden 4096 read 32 KiB of weight a K step at decode (BLOCK_K 256:
    its down GEMM has only 64 programs an active expert) and take 128 x 256 tiles once each
    expert is a dense GEMM (sm_90); Qwen3-30B-A3B's 128 small experts keep the other family."""
    assert expert_kind(8, 4096) == "few" and expert_kind(128, 2048) == "many" and expert_kind(8, 2048) == "many"
    for arch in (80, 90):
        decode, qwen = heuristic_tiles(1, 8, 2, arch, 4096), heuristic_tiles(1, 128, 8, arch, 2048)
        assert decode.block_k == 256 and decode.block_n * decode.block_k * 2 == 32768 and qwen.block_k == 128
        small = heuristic_tiles(256, 8, 2, arch, 4096)  # 64 rows an expert
        assert (small.block_n, small.block_k) == (128, 128)
        large = heuristic_tiles(4096, 8, 2, arch, 4096)
        assert (large.block_m, large.block_n) == ((128, 256) if arch >= 90 else (128, 128))
    assert heuristic_tiles(1, 8, 2, 90) == heuristic_tiles(1, 8, 2, 90, 2048)  # hidden unknown: many


def test_mixtral_decode_splits_the_down_gemm_until_two_programs_an_sm():
    """At one token Mixtral's down GEMM has 2 active experts x 4096 / 64 = 128 programs on 132
    SMs: I = 14336 is split 4 ways (512 programs, 14 K steps of 256 each); Qwen3-30B-A3B's small
    experts (I = 768) never split, nor does anything with one SM (the interpreter)."""
    t = heuristic_tiles(1, 8, 2, 90, 4096, 14336, 132)
    assert t.split_k == 4 and t.splits(14336) == 4 and 2 * (4096 // t.block_n) * t.split_k >= 2 * 132
    assert heuristic_tiles(1, 128, 8, 90, 2048, 768, 132).split_k == 1
    assert heuristic_tiles(4096, 8, 2, 90, 4096, 14336, 132).split_k == 1  # a dense GEMM per expert
    assert heuristic_tiles(1, 8, 2, 90, 4096, 14336).split_k == 1
    with pytest.raises(ValueError, match="MoeTiles.split_k in 1..8"):
        MoeTiles(16, 64, 64, split_k=16)


def test_split_down_gemm_fp16_adds_in_fp32_and_rounds_once():
    """fp16 (the interpreter's bf16 dot is wrong): the splits' fp32 partials and the k slots are
    added in fp32 and rounded once, so the output is within one fp16 rounding of the fp32
    product of the same fp16 inputs (plus the fp32 sums' order)."""
    gen = torch.Generator().manual_seed(7)
    T, E, k, H, I = 2, 4, 2, 32, 256
    hidden = torch.randn(T, H, generator=gen).half()
    w13 = (torch.randn(E, 2 * I, H, generator=gen) / H**0.5).half()
    w2 = (torch.randn(E, H, I, generator=gen) / I**0.5).half()
    weights, ids = route(torch.randn(T, E, generator=gen) * 3, k, renormalize=True)
    # the reference on the kernel's own fp16 activation between the GEMMs
    gate_up = torch.einsum("th,teih->tei", hidden.float(), w13[ids].float()).half()  # (T, k, 2I)
    act = (torch.nn.functional.silu(gate_up[..., :I].float()) * gate_up[..., I:].float()).half()
    terms = torch.einsum("tei,tehi->tehi", act.float(), w2[ids].float()) * weights[:, :, None, None]
    expected, magnitude = terms.sum(dim=(1, 3)), terms.abs().sum(dim=(1, 3))  # (T, H)
    split = triton_fused_experts(hidden, w13, w2, weights, ids, tiles=MoeTiles(16, 32, 32, split_k=4))
    assert split.dtype == torch.float16
    assert ((split.float() - expected).abs() <= expected.abs() * 2**-10 + 1e-3 * magnitude).all()


def test_tune_candidates_are_few_and_start_with_the_heuristic():
    for t in (1, 64, 256, 1024, 4096):
        for E, k, H in SHAPES:
            found = tune_candidates(t, E, k, 90, H, 4 * H, 132)
            assert found[0] == heuristic_tiles(t, E, k, 90, H, 4 * H, 132) and 2 <= len(found) <= 6
            assert len(set(found)) == len(found)
            assert len({c.block_m for c in found}) <= 3  # row blocks near the heuristic's


def test_bad_tiles_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="MoeTiles.block_m must be a power of two >= 16"):
        MoeTiles(24, 64, 64)
    with pytest.raises(ValueError, match="num_warps a power of two"):
        MoeTiles(16, 64, 64, num_warps=3)
