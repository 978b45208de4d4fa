"""The CPU's C kernels for the small ops (``layers/ops/cpu_fused.py``) against the torch layers'
reference arithmetic, through the layers that call them, and the fallback where they do not build."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minivllm.attention.backend import AttentionMetadata
from minivllm.attention.torch_backend import TorchAttentionBackend
from minivllm.c_kernels import UNLOADED
from minivllm.layers.activation import ActAndMul
from minivllm.layers.attention import Attention
from minivllm.layers.norm import GemmaRMSNorm, RMSNorm
from minivllm.layers.ops import cpu_fused
from minivllm.layers.rotary import RotaryEmbedding, share_cos_sin_caches

needs_kernel = pytest.mark.skipif(cpu_fused.load() is None, reason="no C compiler: the CPU kernels did not build")
FP32 = {"rtol": 1e-5, "atol": 1e-5}


@needs_kernel
@pytest.mark.parametrize("tokens, hidden", [(1, 32), (5, 33), (300, 64)])
def test_add_rms_norm_updates_both_in_place_and_equals_torch(tokens, hidden):
    gen = torch.Generator().manual_seed(hidden)
    norm = RMSNorm(hidden, 1e-6)
    norm.weight.data = torch.randn(hidden, generator=gen)
    wide = torch.randn(tokens, hidden + 7, generator=gen) * 3  # rows further apart than their features
    x, residual = wide[:, :hidden], torch.randn(tokens, hidden, generator=gen)
    summed = x + residual
    expected = norm._norm(summed)
    plain = norm(x.contiguous())  # without a residual: a new tensor, the input untouched
    torch.testing.assert_close(plain, norm._norm(x), **FP32)
    out, res = norm(x, residual)
    assert out.data_ptr() == x.data_ptr() and res is residual  # in place, as the Triton kernel does
    assert torch.equal(res, summed)  # the add is exact
    torch.testing.assert_close(out, expected, **FP32)


@needs_kernel
def test_silu_and_mul_equals_torch_on_strided_rows():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20, 2 * 48 + 5, generator=gen)[:, : 2 * 48] * 4  # (T, 2I) rows 101 floats apart
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(ActAndMul("silu")(x), F.silu(gate) * up, **FP32)
    torch.testing.assert_close(cpu_fused.silu_and_mul(x), F.silu(gate) * up, **FP32)


def _cache_step(gen, slots: list[int], hq: int, hk: int, d: int, num_blocks: int = 4, block_size: int = 4):
    """A decode-free flat batch writing ``slots`` of a fresh cache: (meta, cache, qkv)."""
    T = len(slots)
    cache = torch.zeros(2, num_blocks, block_size, hk, d)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor([0, T], dtype=torch.int32),
        seq_lens=torch.tensor([T], dtype=torch.int32),
        block_tables=torch.arange(num_blocks, dtype=torch.int32).view(1, -1),
        max_query_len=T,
        max_seq_len=T,
        query_lens_cpu=[T],
        seq_lens_cpu=[T],
    )
    qkv = torch.randn(T, hq + 2 * hk, d, generator=gen) * 2  # the fused projection's layout
    return meta, cache, qkv


@needs_kernel
@pytest.mark.parametrize("neox_style", [True, False])
def test_rope_and_cache_write_equal_the_torch_layers(neox_style):
    gen = torch.Generator().manual_seed(int(neox_style))
    hq, hk, d = 4, 2, 16
    rope = RotaryEmbedding(d, d, {"rope_type": "default", "rope_theta": 500.0}, neox_style)
    share_cos_sin_caches(rope, 64, torch.device("cpu"))
    positions = torch.tensor([0, 3, 9, 40, 63])
    meta, cache, qkv = _cache_step(gen, [5, 0, -1, 14, 7], hq, hk, d)  # -1: a padding token, not stored
    q_ref, k_ref = rope(positions, qkv[:, :hq].clone(), qkv[:, hq : hq + hk].clone())
    v = qkv[:, hq + hk :]
    attn = Attention(TorchAttentionBackend(), hq, d, hk, d**-0.5)
    attn.kv_cache = cache
    q, k = qkv[:, :hq], qkv[:, hq : hq + hk]
    assert attn.prepare_qkv_(positions, q, k, v, rope, None, None, meta)
    torch.testing.assert_close(q, q_ref, **FP32)  # rotated in place in the qkv tensor
    torch.testing.assert_close(k, k_ref, **FP32)
    flat_k, flat_v = cache[0].view(-1, hk, d), cache[1].view(-1, hk, d)
    for t, slot in enumerate([5, 0, -1, 14, 7]):
        if slot >= 0:
            assert torch.equal(flat_k[slot], k[t]) and torch.equal(flat_v[slot], v[t])
    assert int((flat_k.abs().sum((1, 2)) > 0).sum()) == 4  # nothing else written


@needs_kernel
@pytest.mark.parametrize("neox_style", [True, False])
@pytest.mark.parametrize("eps", [1e-5, 0.7])  # 0.7: large enough to matter against O(1) values
def test_per_head_q_k_norms_before_rope_equal_the_torch_layers(neox_style, eps):
    """Qwen3's per-head RMSNorms on q and k, applied by the rotary kernel before it rotates."""
    gen = torch.Generator().manual_seed(5)
    hq, hk, d = 4, 2, 16
    rope = RotaryEmbedding(d, d, {"rope_type": "default", "rope_theta": 500.0}, neox_style)
    share_cos_sin_caches(rope, 64, torch.device("cpu"))
    positions = torch.tensor([2, 7, 30])
    meta, cache, qkv = _cache_step(gen, [3, 9, 4], hq, hk, d)
    q_norm, k_norm = RMSNorm(d, eps=eps), RMSNorm(d, eps=eps)
    with torch.no_grad():
        q_norm.weight.copy_(torch.rand(d, generator=gen) + 0.5)
        k_norm.weight.copy_(torch.rand(d, generator=gen) + 0.5)
    q_ref, k_ref = q_norm._norm(qkv[:, :hq].clone()), k_norm._norm(qkv[:, hq : hq + hk].clone())
    q_ref, k_ref = rope(positions, q_ref, k_ref)
    attn = Attention(TorchAttentionBackend(), hq, d, hk, d**-0.5)
    attn.kv_cache = cache
    q, k, v = qkv[:, :hq], qkv[:, hq : hq + hk], qkv[:, hq + hk :]
    assert attn.prepare_qkv_(positions, q, k, v, rope, q_norm, k_norm, meta)
    torch.testing.assert_close(q, q_ref, **FP32)
    torch.testing.assert_close(k, k_ref, **FP32)
    flat_k = cache[0].view(-1, hk, d)
    for t, slot in enumerate([3, 9, 4]):
        assert torch.equal(flat_k[slot], k[t])  # the normalised, rotated keys


@pytest.mark.parametrize("why", ["bf16 cache", "partial rotary", "gemma q/k norms", "one of q/k norms"])
def test_rope_and_cache_write_leave_what_they_do_not_serve_to_the_torch_layers(why):
    gen = torch.Generator().manual_seed(1)
    hq, hk, d = 4, 2, 16
    rope = RotaryEmbedding(d, d // 2 if why == "partial rotary" else d, {"rope_type": "default", "rope_theta": 500.0})
    share_cos_sin_caches(rope, 64, torch.device("cpu"))
    meta, cache, qkv = _cache_step(gen, [1, 2], hq, hk, d)
    attn = Attention(TorchAttentionBackend(), hq, d, hk, d**-0.5)
    attn.kv_cache = cache.bfloat16() if why == "bf16 cache" else cache
    before = qkv.clone()
    q_norm = k_norm = GemmaRMSNorm(d) if why == "gemma q/k norms" else None  # w + 1: not the kernel's norm
    if why == "one of q/k norms":
        q_norm = RMSNorm(d)
    q, k, v = qkv[:, :hq], qkv[:, hq : hq + hk], qkv[:, hq + hk :]
    assert not attn.prepare_qkv_(torch.tensor([0, 1]), q, k, v, rope, q_norm, k_norm, meta)
    assert torch.equal(qkv, before) and not attn.kv_cache.any()


def test_without_a_compiler_the_layers_keep_their_torch_code(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(cpu_fused.LIBRARY, "loaded", UNLOADED)
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    assert cpu_fused.load() is None
    assert "did not build" in caplog.text
    gen = torch.Generator().manual_seed(2)
    norm = RMSNorm(32)
    norm.weight.data = torch.randn(32, generator=gen)
    x, residual = torch.randn(3, 32, generator=gen), torch.randn(3, 32, generator=gen)
    out, summed = norm(x, residual)
    assert torch.equal(out, norm._norm(x + residual)) and out.data_ptr() != x.data_ptr()  # torch: not in place
    gate_up = torch.randn(3, 16, generator=gen)
    assert torch.equal(ActAndMul("silu")(gate_up), F.silu(gate_up[:, :8]) * gate_up[:, 8:])
