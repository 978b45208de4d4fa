"""The fused fp8 activation quantization (Triton; the interpreter on a CPU machine)
against its torch reference ``quantize_activations``: the same fp8 bits and the
same fp32 scales, row by row, and through the fp8 linear's ``torch._scaled_mm``."""

from __future__ import annotations

import pytest
import torch

from minivllm.layers.linear import ReplicatedLinear
from minivllm.quantization.fp8 import FP8, Fp8LinearMethod, _fp8_matmul
from minivllm.quantization.triton_fp8_quant import check_fp8_quant_capability, quantize_activations, quantize_fp8_rows

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# The interpreter's numpy warns where the largest values over a small scale overflow to inf,
# which the clamp then brings to 448, as torch does.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in divide:RuntimeWarning")


def assert_same_bits(x: torch.Tensor, input_scale: torch.Tensor | None = None, **kwargs) -> None:
    values, scales = quantize_fp8_rows(x, input_scale, **kwargs)
    ref_values, ref_scales = quantize_activations(x, input_scale)
    assert values.dtype == FP8 and values.shape == x.shape and values.is_contiguous()
    assert scales.dtype == torch.float32 and scales.shape == (x.shape[0], 1)
    assert torch.equal(scales, ref_scales)
    differ = (values.view(torch.uint8) != ref_values.view(torch.uint8)).nonzero()
    assert differ.numel() == 0, f"{len(differ)} values differ, first at {differ[0].tolist()}"


def edge_rows(hidden: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """(8, hidden): random rows over 24 decades of magnitude, a row of zeros, one with the
    dtype's largest values, one nonzero value among zeros, and values too small for
    any fp8 (their scale is the 1e-12 floor)."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(8, hidden, generator=gen) * torch.logspace(-12, 12, 8)[:, None]
    rows[1] = 0.0
    rows[2, ::3] = torch.finfo(dtype).max
    rows[2, 1::3] = -torch.finfo(dtype).max
    rows[3] = 0.0
    rows[3, hidden // 2] = -3.0
    rows[4] = torch.randn(hidden, generator=gen) * 1e-16 if dtype == torch.float32 else 0.0
    big = torch.finfo(dtype).max
    return rows.clamp(-big, big).to(dtype)  # finite: fp16 saturates the largest rows


@pytest.mark.parametrize("max_block", [16384, 32], ids=["one-tile", "tiled"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dynamic_scales_match_torch_bit_for_bit(dtype: torch.dtype, max_block: int) -> None:
    assert_same_bits(edge_rows(80, dtype), max_block=max_block)  # 80 columns: a masked tail either way


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_static_scale_matches_torch_bit_for_bit(dtype: torch.dtype) -> None:
    x = edge_rows(48, dtype)
    assert_same_bits(x, torch.tensor([0.37]))
    assert_same_bits(x, torch.tensor([1e-3]), max_block=16)  # most values clamp to +-448


@pytest.mark.parametrize("scale", [1.0, 0.37])
def test_every_bf16_value_rounds_as_torch_rounds(scale: float) -> None:
    """Every finite bf16 (the ties between fp8 values included) and, in fp32, each tie
    between neighbouring fp8 values one ulp either side: round to nearest even, the
    clamp at +-448, the subnormals and -0.0 alike."""
    bf16 = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    bf16 = bf16[bf16.isfinite()]
    assert_same_bits(bf16.reshape(64, -1), torch.tensor([scale]))  # 65280 values: 64 rows of 1020
    grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float()
    grid = grid[grid.isfinite() & (grid >= 0)].sort().values
    ties = (grid[1:] + grid[:-1]) / 2
    near = torch.cat([ties, ties.nextafter(torch.tensor(0.0)), ties.nextafter(torch.tensor(1e9))])
    assert_same_bits(torch.cat([near, -near]).reshape(2, -1) * scale, torch.tensor([scale]))


def test_strided_rows_are_read_in_place() -> None:
    """A column slice of a wider matrix (a row stride past the row) gives what its copy gives."""
    wide = edge_rows(96, torch.bfloat16)
    view = wide[:, 16:80]
    assert not view.is_contiguous()
    assert_same_bits(view)
    assert torch.equal(
        quantize_fp8_rows(view)[0].view(torch.uint8), quantize_fp8_rows(view.contiguous())[0].view(torch.uint8)
    )


def fp8_layer(static: bool, k: int = 64, n: int = 32, seed: int = 0) -> ReplicatedLinear:
    gen = torch.Generator().manual_seed(seed)
    layer = ReplicatedLinear(k, n, bias=False)
    layer.set_quant_method(Fp8LinearMethod(static_input=static), torch.bfloat16)
    w = torch.randn(n, k, generator=gen)
    scale = w.abs().amax(dim=1) / 448
    layer.weight.data.copy_((w / scale[:, None]).to(FP8))
    layer.weight_scale.data.copy_(scale)
    if static:
        layer.input_scale.data.fill_(4.0 / 448)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_fp8_matmul_with_the_kernel_equals_the_torch_quantization(static: bool) -> None:
    """The linear's GEMM path (``torch._scaled_mm`` runs on the CPU too) on (batch, tokens,
    in) activations: the kernel's inputs to the GEMM are the reference's, so the outputs are."""
    layer = fp8_layer(static)
    x = (torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(1)) * 3).to(torch.bfloat16)
    fused = _fp8_matmul(x, layer, None)
    assert fused.shape == (2, 3, 32) and fused.dtype == torch.bfloat16
    assert torch.equal(fused, _fp8_matmul(x, layer, None, quantize=quantize_activations))


def test_wrapper_rejects_bad_inputs_before_launch() -> None:
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="x dtype must be one of"):
        quantize_fp8_rows(x.to(torch.float64))
    with pytest.raises(ValueError, match="unit stride in its last dim"):
        quantize_fp8_rows(x.t())
    with pytest.raises(ValueError, match=r"input_scale must be \(1,\) fp32"):
        quantize_fp8_rows(x, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="max_block must be a power of two"):
        quantize_fp8_rows(x, max_block=48)
    values, scales = quantize_fp8_rows(x[:0])
    assert values.shape == (0, 32) and scales.shape == (0, 1)


def test_refused_below_sm89() -> None:
    with pytest.raises(ValueError, match=r"compute capability 8\.9 or newer \(this one is 8\.0\)"):
        check_fp8_quant_capability((8, 0))
    check_fp8_quant_capability((8, 9))
    check_fp8_quant_capability((9, 0))


@pytest.mark.gpu
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_cuda_fp8_linear_with_the_kernel_equals_the_torch_quantization(static: bool) -> None:
    """On an sm89+ GPU the layer's forward takes ``_scaled_mm`` with the kernel; the same GEMM
    on the torch path's fp8 activations gives the same bits, also at bench sizes (4096)."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("the fp8 GEMM needs compute capability 8.9+; the layer dequantizes instead")
    for k, n, tokens in ((64, 32, 5), (4096, 256, 33)):
        layer = fp8_layer(static, k, n).cuda()
        x = edge_rows(k, torch.bfloat16)[:, None, :].expand(8, tokens // 8 + 1, k).reshape(-1, k)[:tokens]
        x = (x.cuda() * torch.rand(tokens, 1, device="cuda")).to(torch.bfloat16)
        for rows in (x, x.reshape(1, tokens, k)):
            fused, reference = layer(rows), _fp8_matmul(rows, layer, None, quantize=quantize_activations)
            assert torch.equal(fused.view(torch.int16), reference.view(torch.int16))  # bits: inf and NaN too
        assert_same_bits(x, layer.input_scale if static else None)
        assert_same_bits(torch.cat([x, x], dim=1)[:, k // 2 : k // 2 + k])  # strided rows
