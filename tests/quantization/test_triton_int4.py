"""The Triton int4 dequantize-GEMM (through the interpreter on a CPU machine) against
the torch dequantize reference, on the layout AWQ and GPTQ are converted to."""

from __future__ import annotations

import pytest
import torch

from minivllm.quantization.int4 import dequantize, pack_rows, unpack_rows
from minivllm.quantization.triton_int4 import int4_matmul


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
