"""The int4 dequantize-GEMM's tile configs: each family the heuristic picks, and split-K,
against the torch dequantize reference (interpreter on the CPU), and the heuristic's rules."""

from __future__ import annotations

import os

import pytest
import torch

from minivllm.quantization.int4 import dequantize, pack_rows
from minivllm.quantization.int4_tiles import Int4Tiles, default_split, heuristic_tiles, shape_key, tune_candidates
from minivllm.quantization.triton_int4 import int4_matmul


def _layer(k: int, n: int, group: int, seed: int = 0):
    """Random int4 weights with act-order (scattered) groups."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), generator=gen)
    g_idx = (torch.arange(k) // group)[torch.randperm(k, generator=gen)].to(torch.int32)
    scales = torch.rand(k // group, n, generator=gen) * 0.1 + 0.01
    zeros = torch.randint(0, 17, (k // group, n), generator=gen).to(torch.uint8)
    return pack_rows(q), scales, zeros, g_idx


DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU runs need TRITON_INTERPRET=1"),
    ),
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
    ),
]

# (M, N, K, tiles): the heuristic's four families at tiny shapes, and split-K with a short last split
CASES = [
    (3, 48, 256, Int4Tiles(16, 64, 64, split_k=4)),  # decode: 4 splits of 64 rows
    (3, 48, 160, Int4Tiles(16, 32, 32, split_k=3)),  # 64 + 64 + 32 rows: the last split is short
    (20, 40, 64, Int4Tiles(32, 64, 64, split_k=1)),
    (70, 136, 64, Int4Tiles(64, 128, 64)),  # masked M and N tails
    (130, 72, 128, Int4Tiles(128, 128, 64, num_warps=8)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m, n, k, tiles", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_every_tile_family_matches_the_torch_reference(device, m, n, k, tiles):
    qweight, scales, zeros, g_idx = _layer(k, n, 32)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
    expected = x @ dequantize(qweight, scales, zeros, g_idx, torch.float32)
    out = int4_matmul(*(t.to(device) for t in (x, qweight, scales, zeros, g_idx)), tiles=tiles).cpu()
    assert out.shape == (m, n) and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("group_size", [0, 64], ids=["act-order", "contiguous"])
def test_split_k_bf16_adds_the_partials_in_fp32_and_rounds_once(device, group_size):
    """bf16 activations: with 8 splits, the output is the fp32 sum rounded once to bf16, as
    without splits: each output within one bf16 rounding of the exact product, plus the fp32
    accumulation's order (1e-5 of the sum of the terms' magnitudes). The interpreter's
    fp32 -> bf16 cast truncates (the compiled one rounds to nearest): one ulp there."""
    qweight, scales, zeros, g_idx = _layer(512, 32, 64, seed=3)
    if group_size:
        g_idx = (torch.arange(512) // group_size).to(torch.int32)
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    w = dequantize(qweight, scales, zeros, g_idx, torch.float32)  # (K, N)
    if device == "cuda" and not group_size:  # the general path feeds the tensor cores the dequantized tile in bf16
        w = w.to(torch.bfloat16).float()
    expected, magnitude = x.float() @ w, x.float().abs() @ w.abs()
    args = [t.to(device) for t in (x, qweight, scales, zeros, g_idx)]
    split = int4_matmul(*args, tiles=Int4Tiles(16, 32, 64, split_k=8), group_size=group_size).cpu()
    whole = int4_matmul(*args, tiles=Int4Tiles(16, 32, 64, split_k=1), group_size=group_size).cpu()
    assert split.dtype == torch.bfloat16 and Int4Tiles(16, 32, 64, split_k=8).splits(512) == 8
    ulp = 2**-8 if device == "cuda" else 2**-7  # bf16's 8-bit mantissa: half an ulp rounded, one truncated
    bound = expected.abs() * ulp + 1e-5 * magnitude
    assert ((split.float() - expected).abs() <= bound).all()
    assert ((split.float() - whole.float()).abs() <= 2 * bound).all()


def test_splits_never_leave_a_split_empty():
    tiles = Int4Tiles(16, 64, 128, split_k=16)
    for k in (128, 384, 1000, 4096):
        per = tiles.k_per_split(k)
        assert per % 128 == 0 and (tiles.splits(k) - 1) * per < k <= tiles.splits(k) * per


H100_SMS = 132
SHAPES = [(6144, 4096), (4096, 4096), (14336, 4096), (4096, 14336)]  # (N, K) of benchmarks/quant_gemm.py


@pytest.mark.parametrize("n, k", SHAPES)
def test_heuristic_splits_k_at_decode_only_when_the_grid_is_short(n, k):
    for arch in (80, 90):
        t = heuristic_tiles(1, n, k, arch, H100_SMS)
        programs = (n // t.block_n) * t.splits(k)
        if t.split_k > 1:  # splitting was needed: one split fewer would leave under two programs an SM
            assert (n // t.block_n) * t.split_k // 2 < 2 * H100_SMS
        assert programs >= 2 * H100_SMS or t.k_per_split(k) < 8 * t.block_k or t.split_k == 16
        assert t.k_per_split(k) >= 4 * t.block_k  # each split keeps enough K steps to pipeline
        large = heuristic_tiles(1024, n, k, arch, H100_SMS)
        assert large.split_k == 1 and large.block_m * large.block_n >= 8 * t.block_m * t.block_n
        assert large.num_stages == (4 if arch >= 90 else 3)


def test_default_split_grows_as_the_grid_shrinks():
    splits = [default_split(1, n, 8192, 16, 64, 64, H100_SMS) for n in (32768, 8192, 2048, 512)]
    assert splits == sorted(splits) and splits[0] == 1 and splits[-1] > 1


def test_decode_tiles_are_deeper_on_the_contiguous_path():
    """At M <= 16 the contiguous path reads 4 KiB of packed words a K step (BLOCK_K 128); the
    act-order path keeps BLOCK_K 64 (its per-element gathers spill at 128 on sm_80)."""
    for arch in (80, 90):
        fast = heuristic_tiles(1, 4096, 4096, arch, H100_SMS)
        general = heuristic_tiles(1, 4096, 4096, arch, H100_SMS, act_order=True)
        assert (fast.block_k, general.block_k) == (128, 64)
        assert fast.block_n * fast.block_k // 8 * 4 == 4096
        assert (4096 // fast.block_n) * fast.split_k >= 2 * H100_SMS  # two programs an SM


def test_tuned_table_keys_keep_the_two_paths_apart():
    assert shape_key(4096, 4096, 128, "bfloat16") == "N=4096,K=4096,group=128,bfloat16"
    assert shape_key(4096, 4096, 128, "bfloat16", act_order=True).endswith(",act_order")


def test_tune_candidates_are_few_and_start_with_the_heuristic():
    for m in (1, 16, 128, 1024):
        for arch in (80, 90):
            found = tune_candidates(m, 4096, 14336, arch, H100_SMS)
            assert found[0] == heuristic_tiles(m, 4096, 14336, arch, H100_SMS)
            assert 2 <= len(found) <= 5 and len(set(found)) == len(found)


def test_bad_tiles_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="Int4Tiles.block_n must be a power of two"):
        Int4Tiles(16, 48, 64)
    with pytest.raises(ValueError, match="split_k in 1..16"):
        Int4Tiles(16, 64, 64, split_k=0)
