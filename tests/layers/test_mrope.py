"""M-RoPE (Qwen2-VL's three-section rotary) against transformers' own rotary module."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding, apply_rotary_pos_emb

from minivllm.layers.rotary import MRotaryEmbedding, RotaryEmbedding, get_rope, share_cos_sin_caches
from tests.models.qwen2_vl_checkpoint import tiny_qwen2_vl_config

T, HQ, HK = 11, 4, 2


def _inputs(seed: int = 0):
    text = tiny_qwen2_vl_config().text_config
    head_dim = text.hidden_size // text.num_attention_heads
    g = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 200, (3, T), generator=g)
    q, k = torch.randn(T, HQ, head_dim, generator=g), torch.randn(T, HK, head_dim, generator=g)
    return text, head_dim, positions, q, k


@torch.no_grad()
def _reference(text, positions, q, k):
    cos, sin = Qwen2VLRotaryEmbedding(text)(q, positions[:, None, :])  # (1, T, head_dim) each
    q_ref, k_ref = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    return q_ref[0].transpose(0, 1), k_ref[0].transpose(0, 1)


@pytest.mark.parametrize("cached", [False, True], ids=["computed", "cos_sin_cache"])
def test_three_row_positions_match_transformers(cached: bool):
    text, head_dim, positions, q, k = _inputs()
    rope = get_rope(text, head_dim)
    assert isinstance(rope, MRotaryEmbedding)
    if cached:
        assert share_cos_sin_caches(rope, 256, torch.device("cpu")) == 1
    q_ref, k_ref = _reference(text, positions, q, k)
    q_out, k_out = rope(positions, q.clone(), k.clone())
    torch.testing.assert_close(q_out, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, k_ref, atol=1e-5, rtol=1e-5)
    fused = torch.cat((q, k), dim=1)  # q and k side by side, as a fused qkv holds them
    q_fused, k_fused = rope.forward_qk(positions, fused, HQ)
    torch.testing.assert_close(q_fused, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_fused, k_ref, atol=1e-5, rtol=1e-5)


def test_one_row_positions_are_plain_rope():
    """(T,) positions, and (3, T) with equal rows, rotate like the plain rotary embedding."""
    text, head_dim, positions, q, k = _inputs(seed=1)
    flat = positions[0]
    rope = get_rope(text, head_dim)
    plain = RotaryEmbedding(head_dim, head_dim, {"rope_type": "default", "rope_theta": 10000.0})
    expected = plain(flat, q, k)
    for out in (rope(flat, q, k), rope(flat.expand(3, -1), q, k)):
        torch.testing.assert_close(out[0], expected[0], atol=1e-6, rtol=0)
        torch.testing.assert_close(out[1], expected[1], atol=1e-6, rtol=0)


def test_mrope_section_must_cover_the_rotary_half():
    text, head_dim, *_ = _inputs()
    text.rope_parameters = {**text.rope_parameters, "mrope_section": [2, 3, 2]}
    with pytest.raises(ValueError, match="mrope_section=\\[2, 3, 2\\].*summing to rotary_dim / 2 = 8"):
        get_rope(text, head_dim)
