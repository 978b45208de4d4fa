"""The CUDA matmuls of the quantized layers against their own dequantize reference:
fp8 through ``torch._scaled_mm`` (activations quantized to fp8 too, so a looser
tolerance) and int4 through the Triton kernel."""

from __future__ import annotations

import pytest
import torch

from minivllm.layers.linear import ReplicatedLinear
from minivllm.quantization.awq import AWQLinearMethod
from minivllm.quantization.fp8 import FP8, Fp8LinearMethod

pytestmark = pytest.mark.gpu


def _fp8_layer(static: bool) -> ReplicatedLinear:
    layer = ReplicatedLinear(256, 128, bias=False)
    layer.set_quant_method(Fp8LinearMethod(static_input=static), torch.bfloat16)
    layer = layer.cuda()
    w = torch.randn(128, 256, device="cuda")
    scale = w.abs().amax(dim=1) / 448
    layer.weight.data.copy_((w / scale[:, None]).to(FP8))
    layer.weight_scale.data.copy_(scale)
    if static:
        layer.input_scale.data.fill_(4.0 / 448)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def _fp8_activations(x: torch.Tensor, layer: ReplicatedLinear) -> torch.Tensor:
    """x as the layer's GEMM sees it: quantized to fp8 with its static or per-token scale, back in fp32."""
    if hasattr(layer, "input_scale"):
        scale = layer.input_scale.float().reshape(1, 1)
    else:
        scale = (x.float().abs().amax(dim=-1, keepdim=True) / 448).clamp(min=1e-12)
    return (x.float() / scale).clamp(-448, 448).to(FP8).float() * scale


@pytest.mark.parametrize("static", [False, True])
def test_fp8_scaled_mm_matches_dequantized_matmul(static):
    layer = _fp8_layer(static)
    x = torch.randn(7, 256, device="cuda", dtype=torch.bfloat16).clamp(-4, 4)
    weight = layer.quant_method.dequantize(layer, torch.float32)  # (out, in)
    out = layer(x)
    assert out.dtype == torch.bfloat16
    # Same fp8 inputs on both sides: what is left is fp32 accumulation order and the bf16 output.
    exact = _fp8_activations(x, layer) @ weight.t()
    torch.testing.assert_close(out.float(), exact, rtol=1e-2, atol=1e-2 * exact.abs().max().item())
    # Against the unquantized activations, the fp8 rounding of x (3 mantissa bits) is the error:
    # at most 2^-4 of each |x| term, so bounded by 2^-4 of |x| @ |W|.
    bound = 2.0**-4 * (x.float().abs() @ weight.abs().t()) + 1e-2 * exact.abs().max().item()
    assert ((out.float() - x.float() @ weight.t()).abs() <= bound).all()


def test_int4_layer_uses_the_kernel_and_matches_dequantize():
    layer = ReplicatedLinear(128, 64, bias=False)
    layer.set_quant_method(AWQLinearMethod(32), torch.bfloat16)
    layer = layer.cuda()
    layer.qweight.data.copy_(torch.randint(-(2**31), 2**31 - 1, layer.qweight.shape, dtype=torch.int32))
    layer.qzeros.data.copy_(torch.randint(-(2**31), 2**31 - 1, layer.qzeros.shape, dtype=torch.int32))
    layer.scales.data.copy_(torch.rand(layer.scales.shape) * 0.01)
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(5, 128, device="cuda", dtype=torch.bfloat16)
    from minivllm.quantization.int4 import dequantize

    reference = x.float() @ dequantize(layer.qweight, layer.scales, layer.zeros, layer.g_idx, torch.float32)
    torch.testing.assert_close(layer(x).float(), reference, rtol=2e-2, atol=2e-2 * reference.abs().max().item())
