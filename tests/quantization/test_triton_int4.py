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


def compile_for_cuda(arch: int = 90) -> None:
    """Compile the kernel as the wrapper launches it, for sm_<arch>, down to a cubin
    (no GPU needed). Run without TRITON_INTERPRET: the kernel must be a JITFunction."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from minivllm.quantization.triton_int4 import _int4_matmul_kernel as kernel

    for dtype, fp32_dot in (("bf16", False),):  # the CUDA default; one variant keeps this test short
        types = {"x_ptr": f"*{dtype}", "qw_ptr": "*i32", "scales_ptr": f"*{dtype}", "zeros_ptr": "*u8",
                 "gidx_ptr": "*i32", "out_ptr": f"*{dtype}"}
        constexprs = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "FP32_DOT": fp32_dot}
        signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in kernel.arg_names}
        aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names) if n.endswith("_ptr")}
        triton.compile(ASTSource(kernel, signature, constexprs, aligned), target=GPUTarget("cuda", arch, 32))


@pytest.mark.slow
def test_kernel_compiles_for_cuda_without_a_gpu():
    """The interpreter accepts code the compiler rejects: compile for a Hopper GPU in a
    fresh process where the kernel is defined without the interpreter."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    code = "from tests.quantization.test_triton_int4 import compile_for_cuda; compile_for_cuda(90)"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
