"""fp8 KV cache: the Triton write/attention kernels (interpreted on the CPU) and the
torch backend against torch references, the checkpoint's k/v scales, and the block count."""

from __future__ import annotations

import os

import pytest
import torch

from minivllm.attention.kv_quant import FP8_KV_DTYPE, load_kv_scale
from minivllm.attention.ops import paged_attention, write_kv
from minivllm.attention.torch_backend import write_kv as torch_write_kv

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="CPU runs of the Triton kernels need TRITON_INTERPRET=1",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK, HKV, H, D = 4, 2, 4, 16
K_SCALE, V_SCALE = 0.05, 0.02  # small scales: some values saturate at +-448 * scale


def _reference_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """What the cache should hold: round(x / scale) to e4m3, saturating at its largest value."""
    return (x.float() / torch.tensor(scale, dtype=torch.float32)).clamp(-448, 448).to(FP8_KV_DTYPE)


def _inputs(num_tokens: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    key = torch.randn(num_tokens, HKV, D, generator=gen) * 8  # |k| / K_SCALE reaches past 448
    value = torch.randn(num_tokens, HKV, D, generator=gen) * 4
    return key.to(DEVICE), value.to(DEVICE)


def test_triton_write_kv_stores_scaled_fp8_bytes():
    key, value = _inputs(6)
    slots = torch.tensor([5, 0, -1, 9, 2, 14], device=DEVICE)  # one padding token
    cache = torch.zeros(2, 4, BLOCK, HKV, D, dtype=FP8_KV_DTYPE, device=DEVICE)
    write_kv(key, value, cache, slots, K_SCALE, V_SCALE)
    flat = cache.view(torch.uint8).view(2, -1, HKV, D)
    keep = slots >= 0
    expected_k = _reference_fp8(key[keep].cpu(), K_SCALE).view(torch.uint8)
    expected_v = _reference_fp8(value[keep].cpu(), V_SCALE).view(torch.uint8)
    assert torch.equal(flat[0, slots[keep]].cpu(), expected_k)
    assert torch.equal(flat[1, slots[keep]].cpu(), expected_v)
    assert int((expected_k == _reference_fp8(torch.tensor([1e4]), 1.0).view(torch.uint8)).sum()) > 0  # saturated
    written = torch.zeros(flat.shape[1], dtype=torch.bool)
    written[slots[keep].cpu()] = True
    assert not flat[:, ~written.to(flat.device)].any()  # nothing else touched


def test_triton_write_kv_rounds_like_torch_over_the_whole_range():
    """Normals, subnormals, ties and saturation: the kernel's bytes are torch's fp8 rounding."""
    x = torch.cat([torch.linspace(-460, 460, 8192), torch.linspace(-0.03, 0.03, 8192)]).view(16, 1, 1024)
    cache = torch.zeros(2, 16, 1, 1, 1024, dtype=FP8_KV_DTYPE, device=DEVICE)
    write_kv(x.to(DEVICE), x.to(DEVICE), cache, torch.arange(16, device=DEVICE), 1.0, 1.0)
    expected = x.clamp(-448, 448).to(FP8_KV_DTYPE).view(torch.uint8)
    assert torch.equal(cache[0].view(torch.uint8).view(16, 1, 1024).cpu(), expected)


def test_torch_write_kv_matches_the_triton_kernel():
    key, value = _inputs(5, seed=1)
    slots = torch.tensor([3, 7, 1, -1, 12], device=DEVICE)
    caches = [torch.zeros(2, 4, BLOCK, HKV, D, dtype=FP8_KV_DTYPE, device=DEVICE) for _ in range(2)]
    write_kv(key, value, caches[0], slots, K_SCALE, V_SCALE)
    torch_write_kv(key, value, caches[1], slots, K_SCALE, V_SCALE)
    assert torch.equal(caches[0].view(torch.uint8), caches[1].view(torch.uint8))


@pytest.mark.parametrize("query_lens", [(1, 1), (5, 3)], ids=["decode", "prefill"])
def test_paged_attention_reads_fp8_back_with_its_scales(query_lens):
    """The kernel over an fp8 cache equals float64 attention over the dequantized cache."""
    seq_lens, num_blocks = (9, 6), 8
    gen = torch.Generator().manual_seed(2)
    cache = (torch.randn(2, num_blocks, BLOCK, HKV, D, generator=gen) * 100).to(FP8_KV_DTYPE)
    tables = torch.tensor([[3, 0, 5], [7, 1, 0]], dtype=torch.int32)
    T = sum(query_lens)
    query = torch.randn(T, H, D, generator=gen)
    out = paged_attention(
        query.to(DEVICE),
        cache.to(DEVICE),
        torch.tensor([0, query_lens[0], T], dtype=torch.int32, device=DEVICE),
        torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        tables.to(DEVICE),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        scale=D**-0.5,
        k_scale=K_SCALE,
        v_scale=V_SCALE,
    ).cpu()
    start = 0
    for b, (seq_len, q_len) in enumerate(zip(seq_lens, query_lens)):
        pos = torch.arange(seq_len)
        slots = tables[b, pos // BLOCK].long() * BLOCK + pos % BLOCK
        k = cache[0].reshape(-1, HKV, D)[slots].double() * K_SCALE  # (L, Hkv, D)
        v = cache[1].reshape(-1, HKV, D)[slots].double() * V_SCALE
        q = query[start : start + q_len].double()  # (Q, H, D)
        k, v = k.repeat_interleave(H // HKV, dim=1), v.repeat_interleave(H // HKV, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * D**-0.5
        causal = pos[None, :] <= (seq_len - q_len + torch.arange(q_len))[:, None]
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        expected = torch.einsum("hqk,khd->qhd", probs, v).float()
        torch.testing.assert_close(out[start : start + q_len], expected, atol=1e-4, rtol=1e-4)
        start += q_len


def test_checkpoint_kv_scales_reach_the_attention_layer():
    attn = torch.nn.Module()
    attn.k_scale = attn.v_scale = 1.0
    model = torch.nn.Module()
    model.add_module("self_attn", torch.nn.Module())
    model.self_attn.add_module("attn", attn)
    model = torch.nn.ModuleDict({"layers": torch.nn.ModuleList([model])})
    assert load_kv_scale(model, "layers.0.self_attn.k_proj.k_scale", torch.tensor(0.25))
    assert load_kv_scale(model, "layers.0.self_attn.v_scale", torch.tensor([0.5]))
    assert (attn.k_scale, attn.v_scale) == (0.25, 0.5)
    assert load_kv_scale(model, "layers.0.self_attn.kv_scale", torch.tensor(2.0))
    assert (attn.k_scale, attn.v_scale) == (2.0, 2.0)
    assert not load_kv_scale(model, "layers.0.self_attn.k_proj.weight", torch.ones(2))
    with pytest.raises(ValueError, match="must be positive"):
        load_kv_scale(model, "layers.0.self_attn.k_scale", torch.tensor(0.0))
