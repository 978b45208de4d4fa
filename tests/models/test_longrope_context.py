"""LongRoPE picks its factors by the engine's context (``max_model_len``), as vLLM
does: capped at the original context, a long-context checkpoint rotates with the
short factors and matches transformers, which uses them for every sequence that short."""

from __future__ import annotations

import logging

from minivllm.config.model import rope_parameters
from minivllm.config.store import build_config
from tests.model_configs import phi3_config
from tests.models.test_parity import _assert_matches_transformers, _generate, _load_hf, _prompts

ORIGINAL = 32  # every test sequence (prompt + 10 tokens) fits in it


def _config():
    half = 8  # head_dim 16, fully rotated
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.1 * i for i in range(half)],
        "long_factor": [1.0 + 1.5 * i for i in range(half)],
    }
    return phi3_config(
        partial_rotary_factor=1.0,
        original_max_position_embeddings=ORIGINAL,
        max_position_embeddings=8 * ORIGINAL,
        rope_parameters=rope,
    )


def test_capped_context_uses_the_short_factors_and_matches_transformers(make_checkpoint):
    ckpt = make_checkpoint("phi3-longrope-original32", _config())
    hf_model = _load_hf(ckpt)
    prompts = _prompts(hf_model.config.vocab_size)
    _assert_matches_transformers(hf_model, prompts, _generate(ckpt, prompts, "float32", max_model_len=ORIGINAL))


def test_the_choice_follows_max_model_len_with_a_warning(make_checkpoint, caplog):
    ckpt = make_checkpoint("phi3-longrope-original32", _config())
    for max_len, long in ((ORIGINAL, False), (ORIGINAL + 1, True), (None, True)):
        caplog.clear()
        overrides = [f"model.path={ckpt}", "device=cpu"] + ([f"model.max_model_len={max_len}"] if max_len else [])
        with caplog.at_level(logging.WARNING, logger="minivllm.config.model"):
            cfg = build_config(overrides)
        assert rope_parameters(cfg.hf_config)["use_long_factors"] is long
        assert "LongRoPE" in caplog.text and ("long factors, also" in caplog.text) is long
