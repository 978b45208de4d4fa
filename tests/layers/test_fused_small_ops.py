"""The Triton RMSNorm (+ residual), in-place rotary and SiLU-and-mul kernels against the
torch layers they replace on CUDA, run through Triton's interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch

from minivllm.layers.activation import ActAndMul
from minivllm.layers.norm import GemmaRMSNorm, RMSNorm
from minivllm.layers.ops.fused_rms_norm import rms_norm_
from minivllm.layers.ops.rotary_inplace import rotary_embedding_
from minivllm.layers.ops.silu_and_mul import silu_and_mul
from minivllm.layers.rotary import RotaryEmbedding
from minivllm.models.utils import compile_small_ops

# The interpreter's bf16 arithmetic is not the GPU's: on the CPU, bf16 cases feed
# bf16 values cast to fp32 ("bf16-values"); the gpu-marked test runs real bf16.
DTYPES = ["fp32", "bf16-values"]


def _values(shape: tuple[int, ...], dtype: str) -> torch.Tensor:
    x = torch.randn(shape)
    return x.bfloat16().float() if dtype == "bf16-values" else x


def _norm(hidden: int, dtype: torch.dtype = torch.float32) -> RMSNorm:
    norm = RMSNorm(hidden, eps=1e-5)
    norm.weight.data = (torch.rand(hidden) + 0.5).to(dtype)
    return norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [33, 64, 100])
def test_rms_norm_with_and_without_residual_equals_torch(hidden, dtype):
    torch.manual_seed(hidden)
    norm = _norm(hidden)
    x, residual = _values((5, hidden), dtype), _values((5, hidden), dtype)
    want_plain = norm._norm(x)
    want_out, want_sum = norm._norm(x + residual), x + residual
    got_plain = x.clone()
    rms_norm_(got_plain, norm.weight, norm.eps)
    got_out, got_sum = x.clone(), residual.clone()
    rms_norm_(got_out, norm.weight, norm.eps, got_sum)
    torch.testing.assert_close(got_plain, want_plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_sum, want_sum, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("hidden", [33, 64])
def test_gemma_rms_norm_with_and_without_residual_equals_torch(hidden, dtype):
    """Gemma's ``(1 + weight)`` scaling, in fp32 and rounded once (half precision: fp16, whose
    casts the interpreter rounds as a GPU does)."""
    torch.manual_seed(hidden)
    norm = GemmaRMSNorm(hidden, eps=1e-6)
    norm.weight.data = (torch.rand(hidden) - 0.5).to(dtype)  # zero-centred, as Gemma stores it
    assert norm.use_triton and not norm.is_plain
    x, residual = torch.randn(5, hidden).to(dtype), torch.randn(5, hidden).to(dtype)
    want_plain, want_out, want_sum = norm._norm(x), norm._norm(x + residual), x + residual
    got_plain, got_out, got_sum = x.clone(), x.clone(), residual.clone()
    rms_norm_(got_plain, norm.weight, norm.eps, gemma=True)
    rms_norm_(got_out, norm.weight, norm.eps, got_sum, gemma=True)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(got_plain, want_plain, **tol)
    torch.testing.assert_close(got_out, want_out, **tol)
    torch.testing.assert_close(got_sum, want_sum, atol=0, rtol=0)


def test_rms_norm_reads_strided_rows():
    norm = _norm(16)
    big = torch.randn(4, 40)
    x = big[:, 8:24]  # rows 40 apart, contiguous within a row
    want = norm._norm(x.clone())
    rms_norm_(x, norm.weight, norm.eps)
    torch.testing.assert_close(big[:, 8:24], want)


def test_rms_norm_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm_(torch.randn(2, 8), torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match="residual must be"):
        rms_norm_(torch.randn(2, 8), torch.ones(8), 1e-6, torch.randn(2, 8, dtype=torch.float64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("head_dim,rotary_dim", [(16, 16), (16, 8), (12, 4)])
def test_rotary_in_place_equals_torch(head_dim, rotary_dim, neox, dtype):
    torch.manual_seed(rotary_dim)
    rope = RotaryEmbedding(head_dim, rotary_dim, {"rope_type": "default", "rope_theta": 10000.0}, neox_style=neox)
    positions = torch.tensor([0, 3, 17, 5, 40])
    q = _values((5, 4, head_dim), dtype)
    k = _values((5, 2, head_dim), dtype)
    want_q, want_k = rope(positions, q, k)  # the torch path, cos/sin computed from positions
    cos, sin = rope.cos_sin(torch.arange(64))
    cache = torch.cat((cos, sin), dim=-1)
    qkv = torch.cat((q, k), dim=1)  # q and k as strided views of one buffer, as the models have them
    got_q, got_k = qkv[:, :4], qkv[:, 4:]
    rotary_embedding_(positions, got_q, got_k, cache, neox)
    torch.testing.assert_close(got_q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k, want_k, atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv[..., rotary_dim:], torch.cat((q, k), dim=1)[..., rotary_dim:])  # partial: rest untouched


def test_rotary_cache_path_equals_computed_path():
    """The per-model cos/sin table gives the same rotation as computing cos/sin per step."""
    rope = RotaryEmbedding(8, 8, {"rope_type": "default", "rope_theta": 500.0})
    positions = torch.tensor([1, 9, 2])
    q, k = torch.randn(3, 2, 8), torch.randn(3, 1, 8)
    want = rope(positions, q, k)
    cos, sin = rope.cos_sin(torch.arange(16))
    rope.cos_sin_cache = torch.cat((cos, sin), dim=-1)
    got = rope(positions, q, k)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("inter", [8, 37, 1030])  # 1030: two programs per row, the second partly masked
def test_silu_and_mul_equals_torch(inter, dtype):
    """Half precision is loaded, computed in fp32 and rounded where torch rounds (elementwise:
    the interpreter's half arithmetic is not involved)."""
    torch.manual_seed(inter)
    x = (torch.randn(3, 2 * inter) * 4).to(dtype)
    gate, up = x.chunk(2, dim=-1)
    got = silu_and_mul(x)
    assert got.dtype == dtype and got.shape == (3, inter)
    if dtype == torch.float32:
        torch.testing.assert_close(got, torch.nn.functional.silu(gate) * up, atol=1e-5, rtol=1e-5)
    else:  # upcast: SiLU in fp32 rounded to the dtype, the product in fp32 rounded (ActAndMul's roundings)
        silu = torch.nn.functional.silu(gate.float()).to(dtype)
        want = (silu.float() * up.float()).to(dtype)
        ulp = 2.0 ** -(7 if dtype == torch.bfloat16 else 10)  # SiLU may round one ulp apart (exp), then the product
        torch.testing.assert_close(got.float(), want.float(), atol=1e-3, rtol=2 * ulp)
        if dtype == torch.float16:  # (the interpreter truncates to bf16 where a GPU rounds)
            assert (got == want).float().mean() > 0.9  # nearly all bit-equal: not a different formula


def test_silu_and_mul_reads_strided_rows_and_rejects_bad_inputs():
    big = torch.randn(4, 20)
    x = big[:, 2:18]  # rows 20 apart
    gate, up = x.chunk(2, dim=-1)
    out = torch.full((4, 8), float("nan"))
    silu_and_mul(x, out)
    torch.testing.assert_close(out, torch.nn.functional.silu(gate) * up)
    with pytest.raises(ValueError, match="gate \\| up"):
        silu_and_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match="out must be"):
        silu_and_mul(torch.randn(2, 8), torch.empty(2, 3))
    with pytest.raises(ValueError, match="unit stride"):
        silu_and_mul(torch.randn(8, 2).t())


def test_act_and_mul_takes_the_kernel_only_for_cuda_silu(monkeypatch):
    """The CPU runs the torch path (the kernel is never called); gelu and torch.compile keep it too."""
    import minivllm.layers.ops.silu_and_mul as ops

    def refuse(*args, **kwargs):
        raise AssertionError("the Triton kernel ran on the CPU")

    monkeypatch.setattr(ops, "silu_and_mul", refuse)
    act = ActAndMul("silu")
    assert act.use_triton and not ActAndMul("gelu").use_triton
    x = torch.randn(3, 8)
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(act(x), torch.nn.functional.silu(gate) * up)
    model = torch.nn.Sequential(ActAndMul("silu"), RMSNorm(4))
    compile_small_ops(model)
    assert not model[0].use_triton and not model[1].use_triton
    assert not model[0].use_cpu_kernel and not model[1].use_cpu_kernel  # nor the CPU's C kernels


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_layers_on_cuda_equal_the_torch_path(dtype):
    """Natively on a GPU: the layers' Triton paths against their torch paths, in half precision."""
    torch.manual_seed(0)
    cuda = torch.device("cuda")
    norm = _norm(96, dtype).to(cuda)
    x, residual = torch.randn(7, 96, dtype=dtype, device=cuda), torch.randn(7, 96, dtype=dtype, device=cuda)
    want_out, want_sum = norm._norm(x + residual), x + residual
    got_out, got_sum = norm(x.clone(), residual.clone())
    torch.testing.assert_close(got_sum, want_sum, atol=0, rtol=0)
    torch.testing.assert_close(got_out, want_out, atol=1e-2, rtol=1e-2)
    gemma = GemmaRMSNorm(96).to(cuda)
    gemma.weight.data = (torch.rand(96, device=cuda) - 0.5).to(dtype)
    want_out = gemma._norm(x + residual)
    got_out, _ = gemma(x.clone(), residual.clone())
    torch.testing.assert_close(got_out, want_out, atol=1e-2, rtol=1e-2)
    rope = RotaryEmbedding(64, 32, {"rope_type": "default", "rope_theta": 10000.0})
    positions = torch.arange(7, device=cuda) * 5
    q, k = torch.randn(7, 4, 64, dtype=dtype, device=cuda), torch.randn(7, 2, 64, dtype=dtype, device=cuda)
    want_q, want_k = rope(positions, q, k)
    cos, sin = rope.cos_sin(torch.arange(64, device=cuda))
    rope.cos_sin_cache = torch.cat((cos, sin), dim=-1)
    got_q, got_k = rope(positions, q.clone(), k.clone())
    torch.testing.assert_close(got_q, want_q, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got_k, want_k, atol=1e-2, rtol=1e-2)
    act, gate_up = ActAndMul("silu"), torch.randn(7, 2 * 96, dtype=dtype, device=cuda) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(act(gate_up), torch.nn.functional.silu(gate) * up, atol=1e-2, rtol=1e-2)
