"""The CPU's shortcuts for small batches give the reference's exact bits: RMSNorm as
torch's fused ``rms_norm`` in fp32, and a whole-head fp32 rotation without split and casts."""
from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from minivllm.layers.norm import RMSNorm
from minivllm.layers.rotary import RotaryEmbedding


@pytest.mark.parametrize("tokens, hidden", [(1, 32), (5, 33), (300, 64)])
def test_fp32_rms_norm_has_the_reference_bits(tokens, hidden):
    gen = torch.Generator().manual_seed(hidden)
    norm = RMSNorm(hidden, 1e-6)
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
