"""The CPU's shortcuts for small batches give the reference's exact bits: RMSNorm as
torch's fused ``rms_norm`` in fp32, a whole-head fp32 rotation without split and casts, and
q and k rotated together by the shared rotation table."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from minivllm.layers.norm import RMSNorm
from minivllm.layers.rotary import RotaryEmbedding, share_cos_sin_caches


@pytest.mark.parametrize("tokens, hidden", [(1, 32), (5, 33), (300, 64)])
def test_fp32_rms_norm_has_the_reference_bits(tokens, hidden):
    gen = torch.Generator().manual_seed(hidden)
    norm = RMSNorm(hidden, 1e-6)
    norm.use_cpu_kernel = False  # the torch path (the C kernel's own tests: test_cpu_fused_ops.py)
    norm.weight.data = torch.randn(hidden, generator=gen)
    x, residual = torch.randn(tokens, hidden, generator=gen) * 3, torch.randn(tokens, hidden, generator=gen)
    assert torch.equal(norm(x), norm._norm(x))  # _norm: the fp32 arithmetic written out, as transformers does
    out, summed = norm(x, residual)
    assert torch.equal(summed, x + residual) and torch.equal(out, norm._norm(x + residual))


def test_whole_head_fp32_rotation_equals_transformers():
    gen = torch.Generator().manual_seed(0)
    rope = RotaryEmbedding(16, 16, {"rope_type": "default", "rope_theta": 10000.0})
    positions = torch.tensor([0, 3, 17, 100])
    q, k = torch.randn(4, 4, 16, generator=gen), torch.randn(4, 2, 16, generator=gen)
    cos, sin = rope.cos_sin(positions)  # (T, 8) each
    cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)  # transformers' (T, head_dim) layout
    heads_first = lambda x: x.transpose(0, 1).unsqueeze(0)  # noqa: E731  (1, H, T, D)
    q_ref, k_ref = apply_rotary_pos_emb(heads_first(q), heads_first(k), cos.unsqueeze(0), sin.unsqueeze(0))
    q_out, k_out = rope(positions, q, k)
    torch.testing.assert_close(q_out, q_ref[0].transpose(0, 1), rtol=0, atol=1e-6)
    torch.testing.assert_close(k_out, k_ref[0].transpose(0, 1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("neox_style", [True, False])
@pytest.mark.parametrize("head_dim, rotary_dim", [(8, 8), (16, 4)])  # whole head (the table), partial (the reference)
def test_q_and_k_rotated_together_have_the_reference_bits(neox_style, head_dim, rotary_dim):
    gen = torch.Generator().manual_seed(rotary_dim)
    params = {"rope_type": "default", "rope_theta": 500.0}
    fast = RotaryEmbedding(head_dim, rotary_dim, params, neox_style)
    reference = RotaryEmbedding(head_dim, rotary_dim, params, neox_style)  # no tables: cos/sin from the positions
    assert share_cos_sin_caches(fast, 64, torch.device("cpu")) == 1
    assert (fast.rotation_table is not None) and reference.rotation_table is None
    positions = torch.tensor([0, 1, 9, 33, 63])
    qkv = torch.randn(5, 4 + 2 + 2, head_dim, generator=gen) * 4  # (T, Hq + 2 Hk, D) as the qkv projection lays it out
    q_ref, k_ref = reference(positions, qkv[:, :4], qkv[:, 4:6])
    q, k = fast.forward_qk(positions, qkv[:, :6], 4)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    q, k = fast(positions, qkv[:, :4], qkv[:, 4:6])
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
