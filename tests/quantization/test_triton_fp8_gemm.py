"""The Triton fp8 W8A8 GEMM (the interpreter on a CPU machine) against the dequantized fp32
product of the same fp8 operands, split-K included, and the fp8 linear's use of it for the
activations ``torch._scaled_mm``'s row-wise path does not take."""

from __future__ import annotations

import pytest
import torch

from minivllm import tuned_tiles
from minivllm.layers.linear import ReplicatedLinear
from minivllm.quantization.fp8 import FP8, Fp8LinearMethod, Fp8OnlineMethod, _fp8_matmul, _pick_gemm, _triton_gemm
from minivllm.quantization.int4_tiles import Int4Tiles
from minivllm.quantization.triton_fp8_gemm import (
    KERNEL,
    check_fp8_gemm_capability,
    choose_gemm,
    fp8_gemm,
    fp8_tiles,
    shape_key,
)
from minivllm.quantization.triton_fp8_quant import quantize_activations
from minivllm.tuned_tiles import CPU


def _operands(m: int, n: int, k: int, seed: int = 0):
    """fp8 activations and weight with their fp32 scales (per token, per output channel)."""
    gen = torch.Generator().manual_seed(seed)
    x, x_scale = quantize_activations(torch.randn(m, k, generator=gen) * 3)  # (M, K) fp8, (M, 1)
    w = torch.randn(n, k, generator=gen)
    w_scale = w.abs().amax(dim=1) / 448  # (N,)
    return x, x_scale, (w / w_scale[:, None]).to(FP8), w_scale


def _reference(x, x_scale, w, w_scale, bias=None):
    out = (x.float() * x_scale) @ (w.float() * w_scale[:, None]).t()
    return out if bias is None else out + bias.float()


# (M, N, K, tiles): masked M, N and K tails, split-K with a short last split
CASES = [
    (5, 48, 96, Int4Tiles(16, 32, 32)),
    (3, 40, 320, Int4Tiles(16, 32, 64, split_k=3)),  # 128 + 128 + 64 rows of K
    (19, 24, 200, Int4Tiles(32, 16, 64, split_k=2)),  # K not a multiple of BLOCK_K
    (70, 136, 64, Int4Tiles(64, 128, 64)),
]


@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("m, n, k, tiles", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_kernel_matches_the_dequantized_product_fp32(m, n, k, tiles, bias):
    x, x_scale, w, w_scale = _operands(m, n, k, seed=m)
    b = torch.randn(n, generator=torch.Generator().manual_seed(9)) if bias else None
    out = fp8_gemm(x, x_scale, w, w_scale, torch.float32, b, tiles=tiles)
    assert out.shape == (m, n) and out.dtype == torch.float32
    expected = _reference(x, x_scale, w, w_scale, b)  # the bias once, whatever the splits
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)


def test_fp16_output_is_the_fp32_sum_rounded_once():
    x, x_scale, w, w_scale = _operands(3, 32, 512, seed=4)
    expected = _reference(x, x_scale, w, w_scale)
    magnitude = (x.float() * x_scale).abs() @ (w.float() * w_scale[:, None]).abs().t()
    out = fp8_gemm(x, x_scale, w, w_scale, torch.float16, tiles=Int4Tiles(16, 32, 64, split_k=8))
    assert out.dtype == torch.float16
    assert ((out.float() - expected).abs() <= expected.abs() * 2**-10 + 1e-5 * magnitude).all()


def test_decode_tiles_split_k_until_two_programs_an_sm():
    for n, k in ((4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336)):
        for arch in (89, 90):
            t = fp8_tiles(1, n, k, arch, 132)
            assert (t.block_m, t.block_k) == (16, 128) and t.k_per_split(k) >= 4 * t.block_k
            assert (n // t.block_n) * t.splits(k) >= 2 * 132 or t.k_per_split(k) < 8 * t.block_k
    assert fp8_tiles(2048, 4096, 4096, 90, 132).block_m == 128


def _fp8_layer(k: int = 64, n: int = 32, bias: bool = False) -> ReplicatedLinear:
    layer = ReplicatedLinear(k, n, bias=bias)
    layer.set_quant_method(Fp8LinearMethod(static_input=False), torch.float16)
    _, _, w, w_scale = _operands(1, n, k, seed=3)
    layer.weight.data.copy_(w)
    layer.weight_scale.data.copy_(w_scale)
    if bias:
        layer.bias.data.normal_()
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def test_fp8_linear_through_the_triton_gemm_matches_its_reference():
    """The layer's GEMM path on (batch, tokens, in) fp32 activations with the Triton GEMM in
    place of ``_scaled_mm``: the dequantized product of the same fp8 activations."""
    layer = _fp8_layer(bias=True)
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(1)) * 3
    out = _fp8_matmul(x, layer, layer.bias, quantize=quantize_activations, gemm=_triton_gemm)
    x_fp8, x_scale = quantize_activations(x.reshape(-1, 64))
    expected = _reference(x_fp8, x_scale, layer.weight, layer.weight_scale, layer.bias).reshape(2, 3, 32)
    assert out.shape == (2, 3, 32)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)


def test_wrapper_rejects_bad_inputs_before_launch():
    x, x_scale, w, w_scale = _operands(4, 32, 64)
    with pytest.raises(ValueError, match="must be torch.float8_e4m3fn"):
        fp8_gemm(x.float(), x_scale, w, w_scale, torch.float16)
    with pytest.raises(ValueError, match=r"weight must be \(N, K=64\)"):
        fp8_gemm(x, x_scale, w[:, :32], w_scale, torch.float16)
    with pytest.raises(ValueError, match=r"w_scale must be \(32,\) contiguous fp32"):
        fp8_gemm(x, x_scale, w, w_scale[:16], torch.float16)
    with pytest.raises(ValueError, match="out_dtype torch.float64"):
        fp8_gemm(x, x_scale, w, w_scale, torch.float64)
    assert fp8_gemm(x[:0], x_scale[:0], w, w_scale, torch.float16).shape == (0, 32)
    with pytest.raises(ValueError, match=r"compute capability 8\.9 or newer \(this one is 8\.6\)"):
        check_fp8_gemm_capability((8, 6))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("m", [1, 16, 300])
def test_cuda_fp16_fp8_linear_takes_the_triton_gemm(m):
    """sm89+: an fp16 fp8 linear runs the Triton GEMM on the fp8 tensor cores (not the
    dequantized weight); the bf16 GEMM agrees with _scaled_mm on the same operands."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("the fp8 GEMM needs compute capability 8.9+; the layer dequantizes instead")
    layer = _fp8_layer(512, 256).cuda()
    x = torch.randn(m, 512, device="cuda", dtype=torch.float16)
    x_fp8, x_scale = quantize_activations(x)
    expected = _reference(x_fp8, x_scale, layer.weight, layer.weight_scale)
    torch.testing.assert_close(layer(x).float(), expected, rtol=2e-3, atol=2e-3 * expected.abs().max().item())
    bf16 = fp8_gemm(x_fp8, x_scale, layer.weight, layer.weight_scale, torch.bfloat16)
    scaled_mm = torch._scaled_mm(
        x_fp8, layer.weight.t(), scale_a=x_scale, scale_b=layer.weight_scale.reshape(1, -1), out_dtype=torch.bfloat16
    )
    torch.testing.assert_close(bf16.float(), scaled_mm.float(), rtol=1e-2, atol=1e-2 * expected.abs().max().item())


@pytest.fixture
def tables_dir(tmp_path, monkeypatch):
    """An empty tables folder standing in for the package's."""
    monkeypatch.setattr(tuned_tiles, "TABLES_DIR", tmp_path)
    tuned_tiles._read.cache_clear()
    yield tmp_path
    tuned_tiles._read.cache_clear()


def test_the_tuned_table_picks_the_gemm_of_a_bf16_linear(tables_dir):
    """No entry: bf16 takes _scaled_mm (None), other dtypes the Triton heuristic's tiles; an
    entry names the backend (and the Triton tiles) for its M bucket."""
    assert choose_gemm(1, 32, 64, "bfloat16", CPU) is None
    assert choose_gemm(1, 32, 64, "float16", CPU) == fp8_tiles(1, 32, 64, None, CPU.num_sms)
    tiles = Int4Tiles(16, 32, 32, split_k=2)
    entries = {1: {"backend": "triton", **tiles.as_dict()}, 256: {"backend": "scaled_mm"}}
    tuned_tiles.merge_entries(tables_dir / f"{KERNEL}.json", KERNEL, "cpu", shape_key(32, 64, "bfloat16"), entries)
    assert choose_gemm(4, 32, 64, "bfloat16", CPU) == tiles
    assert choose_gemm(300, 32, 64, "bfloat16", CPU) is None
    assert choose_gemm(4, 64, 64, "bfloat16", CPU) is None  # another weight: nothing tuned


def test_linear_takes_the_gemm_the_table_names(tables_dir):
    """``_pick_gemm`` (the fp8 linear's GEMM on an sm89+ GPU) on bf16 activations: the Triton
    kernel at the table's tiles where it won, ``_scaled_mm`` elsewhere; both the reference."""
    layer = _fp8_layer()
    x = (torch.randn(4, 64, generator=torch.Generator().manual_seed(2)) * 3).to(torch.bfloat16)
    scaled_mm = _fp8_matmul(x, layer, None, quantize=quantize_activations)
    assert torch.equal(_fp8_matmul(x, layer, None, quantize=quantize_activations, gemm=_pick_gemm), scaled_mm)
    entries = {4: {"backend": "triton", **Int4Tiles(16, 32, 32, split_k=2).as_dict()}}
    tuned_tiles.merge_entries(tables_dir / f"{KERNEL}.json", KERNEL, "cpu", shape_key(32, 64, "bfloat16"), entries)
    triton = _fp8_matmul(x, layer, None, quantize=quantize_activations, gemm=_pick_gemm)
    assert triton.dtype == torch.bfloat16 and not torch.equal(triton, scaled_mm)  # another GEMM ran
    x_fp8, x_scale = quantize_activations(x)
    expected = _reference(x_fp8, x_scale, layer.weight, layer.weight_scale)
    # one bf16 rounding each (the interpreter's cast truncates: one ulp)
    torch.testing.assert_close(triton.float(), expected, rtol=2**-7, atol=1e-3)
    torch.testing.assert_close(scaled_mm.float(), expected, rtol=2**-8, atol=1e-3)


@pytest.mark.parametrize("online", [False, True], ids=["checkpoint", "online"])
def test_the_loaded_weight_is_the_operand_scaled_mm_wants_without_a_copy(online):
    """(out, in) row-major after loading: ``weight.t()`` is the column-major (in, out) view the
    row-wise ``_scaled_mm`` takes, and the per-channel scale a contiguous (out,) fp32 vector."""
    if online:
        layer = ReplicatedLinear(64, 32, bias=False)
        layer.set_quant_method(Fp8OnlineMethod(), torch.float32)
        layer.weight.data.normal_()
        layer.quant_method.process_weights_after_loading(layer)
    else:
        layer = _fp8_layer()
    assert layer.weight.dtype == FP8 and layer.weight.shape == (32, 64) and layer.weight.is_contiguous()
    assert layer.weight.t().stride() == (1, 64)  # column-major (in, out)
    assert layer.weight_scale.shape == (32,) and layer.weight_scale.is_contiguous()
