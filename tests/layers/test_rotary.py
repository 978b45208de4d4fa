"""RoPE against transformers' own rotary modules, at positions past the original context."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, Phi3Config
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

from minivllm.config.model import rope_parameters
from minivllm.config.store import build_config
from minivllm.layers.rotary import get_rope
from tests.model_configs import llama_config

ORIGINAL = 64  # the "pretraining" context of these configs
HEAD_DIM = 32


def _llama(rope: dict) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=128,
        num_attention_heads=4,
        head_dim=HEAD_DIM,
        max_position_embeddings=ORIGINAL,
        rope_parameters=rope,
    )


@torch.no_grad()
def _reference(hf_rotary, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' cos/sin for one sequence holding ``positions``, first half of each (they repeat)."""
    x = torch.zeros(1, positions.numel(), 8)
    cos, sin = hf_rotary(x, positions[None])
    half = cos.shape[-1] // 2
    return cos[0, :, :half], sin[0, :, :half]


def _assert_same(ours, positions, hf_rotary, atol=2e-5):
    cos, sin = ours.cos_sin(positions)
    ref_cos, ref_sin = _reference(hf_rotary, positions)
    torch.testing.assert_close(cos, ref_cos, atol=atol, rtol=0)
    torch.testing.assert_close(sin, ref_sin, atol=atol, rtol=0)


ROPES = {
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
        "rope_theta": 500000.0,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL, "rope_theta": 1e6},
    "yarn-mscale-beta": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": ORIGINAL,
        "rope_theta": 10000.0,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "beta_fast": 16,
        "beta_slow": 2,
    },
}


@pytest.mark.parametrize("name", ROPES)
def test_static_scaling_matches_transformers_past_the_original_context(name):
    config = _llama(dict(ROPES[name]))
    positions = torch.arange(ORIGINAL - 4, 4 * ORIGINAL)
    _assert_same(get_rope(config, HEAD_DIM), positions, LlamaRotaryEmbedding(config))


def test_yarn_scales_cos_and_sin():
    rope = get_rope(_llama(dict(ROPES["yarn"])), HEAD_DIM)
    cos, sin = rope.cos_sin(torch.tensor([0]))
    assert rope.freqs.attention_factor > 1.1 and cos[0, 0].item() == pytest.approx(rope.freqs.attention_factor)


def test_dynamic_ntk_matches_transformers_at_its_scaled_context():
    """transformers re-derives the base from the batch's longest sequence; ours is
    fixed at the full scaled context (factor * max_position_embeddings)."""
    config = _llama({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    positions = torch.arange(2 * ORIGINAL)  # longest sequence = the scaled context
    ours = get_rope(config, HEAD_DIM)
    cos, sin = ours.cos_sin(positions)
    ref_cos, ref_sin = _reference(LlamaRotaryEmbedding(config), positions)
    past = slice(ORIGINAL, None)
    torch.testing.assert_close(cos[past], ref_cos[past], atol=2e-5, rtol=0)
    torch.testing.assert_close(sin[past], ref_sin[past], atol=2e-5, rtol=0)
    plain = get_rope(_llama({"rope_type": "default", "rope_theta": 10000.0}), HEAD_DIM).cos_sin(positions)[0]
    assert (plain[past] - cos[past]).abs().max() > 1e-2  # the scaling does change the angles


def _phi3_longrope(max_position_embeddings: int, **rope) -> Phi3Config:
    """Phi-3-128k's layout: ``original_max_position_embeddings`` outside rope_parameters, per-pair factors."""
    half = HEAD_DIM // 2
    rope = {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.05 * i for i in range(half)],
        "long_factor": [1.0 + 0.9 * i for i in range(half)],
        **rope,
    }
    return Phi3Config(
        hidden_size=128,
        num_attention_heads=4,
        max_position_embeddings=max_position_embeddings,
        original_max_position_embeddings=ORIGINAL,
        rope_parameters=rope,
    )


@pytest.mark.parametrize("rope", [{}, {"attention_factor": 1.3}], ids=["derived-attention", "given-attention"])
def test_longrope_long_factors_match_transformers_past_the_original_context(rope):
    """A checkpoint whose context exceeds the original one rotates with its long factors,
    as transformers does for any sequence longer than the original context."""
    config = _phi3_longrope(8 * ORIGINAL, **rope)
    ours = get_rope(config, HEAD_DIM)
    _assert_same(ours, torch.arange(8 * ORIGINAL), Phi3RotaryEmbedding(config))
    derived = (1 + math.log(8) / math.log(ORIGINAL)) ** 0.5  # context 8x the original one
    assert ours.freqs.attention_factor == pytest.approx(rope.get("attention_factor", derived))


def test_longrope_within_the_original_context_uses_the_short_factors():
    config = _phi3_longrope(ORIGINAL, attention_factor=1.1)
    _assert_same(get_rope(config, HEAD_DIM), torch.arange(ORIGINAL), Phi3RotaryEmbedding(config))


def test_old_rope_scaling_and_rope_theta_attributes_are_read():
    old = SimpleNamespace(rope_scaling={"type": "linear", "factor": 2.0}, rope_theta=5e5, max_position_embeddings=32)
    params = rope_parameters(old)
    assert (params["rope_type"], params["factor"], params["rope_theta"]) == ("linear", 2.0, 5e5)


def test_unknown_rope_type_names_the_supported_ones():
    with pytest.raises(ValueError, match="rope_type='su'.*yarn, longrope"):
        get_rope(SimpleNamespace(rope_parameters={"rope_type": "su", "rope_theta": 1e4}), HEAD_DIM)


def test_an_unsupported_rope_type_fails_when_the_config_is_built(make_checkpoint):
    ckpt = make_checkpoint("llama-gqa-untied", llama_config(tie=False))
    with pytest.raises(ValueError, match=r"rope_parameters.rope_type='su': supported are default, linear"):
        build_config([f"model.path={ckpt}", "device=cpu", "+model.hf_overrides.rope_scaling.rope_type=su"])


@pytest.mark.parametrize("type_key", ["rope_type", "type"])
def test_rope_scaling_override_without_theta_keeps_the_checkpoint_base(type_key, make_checkpoint):
    """``hf_overrides={"rope_scaling": {...}}`` without rope_theta used to leave it None (TypeError)."""
    ckpt = make_checkpoint("llama-theta5e4", llama_config(rope_parameters={"rope_type": "default", "rope_theta": 5e4}))
    cfg = build_config(
        [
            f"model.path={ckpt}",
            "device=cpu",
            f"+model.hf_overrides.rope_scaling.{type_key}=linear",
            "+model.hf_overrides.rope_scaling.factor=2.0",
        ]
    )
    params = cfg.hf_config.rope_parameters
    assert (params["rope_type"], params["factor"], params["rope_theta"]) == ("linear", 2.0, 5e4)
    reference = llama_config(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e4})
    positions = torch.arange(300)
    _assert_same(get_rope(cfg.hf_config, 16), positions, LlamaRotaryEmbedding(reference))
