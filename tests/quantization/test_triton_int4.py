"""The Triton int4 dequantize-GEMM (through the interpreter on a CPU machine) against
the torch dequantize reference, on the layout AWQ and GPTQ are converted to."""

from __future__ import annotations

import pytest
import torch

from minivllm.layers.linear import ReplicatedLinear
from minivllm.quantization.awq import AWQLinearMethod
from minivllm.quantization.gptq import GPTQConfig, GPTQLinearMethod
from minivllm.quantization.int4 import contiguous_group_size, dequantize, pack_rows, unpack_rows
from minivllm.quantization.int4_tiles import Int4Tiles
from minivllm.quantization.triton_int4 import fast_path_tiles, int4_matmul


def _layer(k: int, n: int, group: int, scattered: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), generator=gen)
    g_idx = torch.arange(k) // group
    if scattered:  # GPTQ act-order: rows of a group spread over the input
        g_idx = g_idx[torch.randperm(k, generator=gen)]
    num_groups = k // group
    scales = torch.rand(num_groups, n, generator=gen) * 0.1 + 0.01
    zeros = torch.randint(0, 17, (num_groups, n), generator=gen).to(torch.uint8)
    return pack_rows(q), scales, zeros, g_idx.to(torch.int32), q


def test_pack_rows_round_trips_and_matches_the_bit_layout():
    _, _, _, _, q = _layer(16, 3, 8, False)
    packed = pack_rows(q)
    assert torch.equal(unpack_rows(packed), q.to(torch.int32))
    word = sum(int(q[i, 0]) << (4 * i) for i in range(8))  # row k in bits 4k..4k+3 of word k // 8
    assert packed[0, 0].item() == (word if word < 2**31 else word - 2**32)


@pytest.mark.parametrize(("m", "scattered"), [(5, False), (19, True)])
def test_kernel_matches_torch_dequantize_fp32(m, scattered):
    k, n = 64, 48  # n is not a multiple of BLOCK_N and m not of BLOCK_M: masked tails
    qweight, scales, zeros, g_idx, _ = _layer(k, n, 32, scattered)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
    expected = x @ dequantize(qweight, scales, zeros, g_idx, torch.float32)
    out = int4_matmul(x, qweight, scales, zeros, g_idx)
    assert out.shape == (m, n) and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_kernel_bf16_activations_within_bf16_rounding():
    qweight, scales, zeros, g_idx, _ = _layer(64, 32, 32, False)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    expected = x @ dequantize(qweight, scales, zeros, g_idx, torch.float32)
    out = int4_matmul(x.to(torch.bfloat16), qweight, scales.to(torch.bfloat16), zeros, g_idx)
    assert out.dtype == torch.bfloat16
    # bf16 inputs and scales (8 bits of mantissa) over a 64-term sum: ~1% of the output scale
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())


def test_wrapper_rejects_bad_inputs_before_launch():
    qweight, scales, zeros, g_idx, _ = _layer(64, 32, 32, False)
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="zeros must be uint8"):
        int4_matmul(x, qweight, scales, zeros.to(torch.int32), g_idx)
    with pytest.raises(ValueError, match=r"qweight must be int32 \(K/8, N\) = \(4, N\)"):
        int4_matmul(x[:, :32], qweight, scales, zeros, g_idx)
    with pytest.raises(ValueError, match="g_idx must be int32"):
        int4_matmul(x, qweight, scales, zeros, g_idx.long())


# ---- the contiguous-groups fast path ---------------------------------------------------------


def test_contiguous_group_size_is_found_only_for_groups_in_input_order():
    k = 64
    assert contiguous_group_size((torch.arange(k) // 16).to(torch.int32), 4) == 16
    assert contiguous_group_size(torch.zeros(k, dtype=torch.int32), 1) == k  # one group (group_size -1)
    act_order = (torch.arange(k) // 16)[torch.randperm(k, generator=torch.Generator().manual_seed(0))]
    assert contiguous_group_size(act_order.to(torch.int32), 4) == 0
    assert contiguous_group_size((torch.arange(k) // 16).to(torch.int32), 3) == 0  # 64 rows do not split in 3
    shifted = (torch.arange(k) // 16 + 1).clamp(max=3)  # groups in order but not starting at row 0
    assert contiguous_group_size(shifted.to(torch.int32), 4) == 0


def test_fast_path_tiles_fit_the_k_tile_inside_one_group():
    tiles = Int4Tiles(16, 64, 64, split_k=2)
    assert fast_path_tiles(tiles, 128) == tiles and fast_path_tiles(tiles, 64) == tiles
    assert fast_path_tiles(tiles, 32) == Int4Tiles(16, 64, 32, split_k=2)  # BLOCK_K cut to the group
    assert fast_path_tiles(tiles, 24) is None and fast_path_tiles(tiles, 8) is None  # the general path
    assert fast_path_tiles(tiles, 0) is None


# (M, N, K, group, tiles): split-K off and on (a short last split), BLOCK_K larger than the group
# (cut), masked M and N tails, one group over the whole K
FAST_CASES = [
    (5, 48, 256, 64, Int4Tiles(16, 32, 32)),
    (3, 48, 256, 64, Int4Tiles(16, 64, 64, split_k=4)),
    (3, 40, 320, 64, Int4Tiles(16, 32, 64, split_k=3)),  # 128 + 128 + 64 rows
    (19, 24, 256, 32, Int4Tiles(32, 16, 128, split_k=2)),  # BLOCK_K 128 cut to 32
    (70, 136, 128, 128, Int4Tiles(64, 128, 64)),
    (2, 32, 96, 96, Int4Tiles(16, 32, 32, split_k=2)),  # group 96: 3 K tiles of 32 inside it
]


@pytest.mark.parametrize("m, n, k, group, tiles", FAST_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_fast_path_matches_the_torch_reference_fp32(m, n, k, group, tiles):
    qweight, scales, zeros, g_idx, _ = _layer(k, n, group, False, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
    expected = x @ dequantize(qweight, scales, zeros, g_idx, torch.float32)
    out = int4_matmul(x, qweight, scales, zeros, g_idx, tiles=tiles, group_size=group)
    general = int4_matmul(x, qweight, scales, zeros, g_idx, tiles=tiles)
    assert out.shape == (m, n) and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, general, rtol=1e-5, atol=1e-5)


def test_fast_path_fp16_rounds_the_split_k_sum_once():
    """fp16 activations and scales, 4 splits: the fp32 partials' sum rounded once to fp16."""
    qweight, scales, zeros, g_idx, _ = _layer(256, 32, 64, False, seed=5)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(6)).to(torch.float16)
    scales = scales.to(torch.float16)
    w = dequantize(qweight, scales, zeros, g_idx, torch.float32)
    expected, magnitude = x.float() @ w, x.float().abs() @ w.abs()
    out = int4_matmul(x, qweight, scales, zeros, g_idx, tiles=Int4Tiles(16, 32, 64, split_k=4), group_size=64)
    assert out.dtype == torch.float16
    assert ((out.float() - expected).abs() <= expected.abs() * 2**-10 + 1e-5 * magnitude).all()


def test_fast_path_refuses_a_group_size_that_does_not_tile_k():
    qweight, scales, zeros, g_idx, _ = _layer(64, 32, 32, False)
    with pytest.raises(ValueError, match="group_size 16 x 2 groups != K=64"):
        int4_matmul(torch.randn(2, 64), qweight, scales, zeros, g_idx, tiles=Int4Tiles(16, 32, 16), group_size=16)


def _awq_layer(k: int, n: int, group: int):
    layer = ReplicatedLinear(k, n, bias=False)
    layer.set_quant_method(AWQLinearMethod(group), torch.float32)
    gen = torch.Generator().manual_seed(0)
    for name in ("qweight", "qzeros"):
        p = getattr(layer, name)
        p.data.copy_(torch.randint(-(2**31), 2**31 - 1, p.shape, dtype=torch.int32, generator=gen))
    layer.scales.data.copy_(torch.rand(layer.scales.shape, generator=gen) * 0.01)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def test_awq_layers_take_the_fast_path_and_act_order_gptq_does_not():
    assert _awq_layer(64, 32, 32).int4_group_size == 32
    layer = ReplicatedLinear(64, 32, bias=False)
    layer.set_quant_method(GPTQLinearMethod(GPTQConfig(32, True, 1, [])), torch.float32)
    layer.g_idx.data.copy_((torch.arange(64) // 32)[torch.randperm(64, generator=torch.Generator().manual_seed(0))])
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.int4_group_size == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("m", [1, 16, 200])
def test_tensor_core_fast_path_bf16_on_cuda(m):
    """bf16 on the tensor cores (q - zero exact in bf16, the scale applied to the fp32 partial):
    within one bf16 rounding of the dequantized fp32 product, at the heuristic's tiles."""
    layer = _awq_layer(512, 256, 128).to("cuda")
    x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16)
    scales = layer.scales.to(torch.bfloat16)
    w = dequantize(layer.qweight, scales, layer.zeros, layer.g_idx, torch.float32)
    expected, magnitude = x.float() @ w, x.float().abs() @ w.abs()
    out = int4_matmul(x, layer.qweight, scales, layer.zeros, layer.g_idx, group_size=layer.int4_group_size)
    general = int4_matmul(x, layer.qweight, scales, layer.zeros, layer.g_idx)
    bound = expected.abs() * 2**-8 + 1e-4 * magnitude
    assert ((out.float() - expected).abs() <= bound).all()
    assert ((general.float() - expected).abs() <= bound + 2**-8 * magnitude).all()
