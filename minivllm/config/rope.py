"""The ``rope_type`` a checkpoint names, read from its config: what ``layers/rotary.py`` builds
and what the config checks when it is built (a rope_type this engine lacks fails there).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

ROPE_TYPES = ("default", "linear", "llama3", "dynamic", "yarn", "longrope")
"""The schemes ``layers/rope_scaling.py`` computes frequencies for."""


def rope_parameters(hf_config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """One flat ``{"rope_theta": ..., "rope_type": ..., **scaling}`` dict.

    Reads transformers 5's ``rope_parameters`` (flat, or nested by layer type as
    Gemma 3 stores a base per ``sliding_attention`` / ``full_attention``; pass
    ``layer_type`` to pick one) and the older ``rope_scaling`` + ``rope_theta``.
    """
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = dict(params[layer_type])
    if params.get("rope_theta") is None:
        params["rope_theta"] = getattr(hf_config, "rope_theta", None) or 10000.0
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if params["rope_type"] == "mrope":  # older Qwen2-VL configs: default frequencies, sectioned by mrope_section
        params["rope_type"] = "default"
    if params.get("original_max_position_embeddings") is None:
        original = getattr(hf_config, "original_max_position_embeddings", None)
        params["original_max_position_embeddings"] = original or getattr(hf_config, "max_position_embeddings", None)
    long_factors = getattr(hf_config, LONG_FACTORS_ATTR, None)
    if params["rope_type"] == "longrope" and long_factors is not None:
        params["use_long_factors"] = long_factors
    return params


LONG_FACTORS_ATTR = "minivllm_longrope_long_factors"
"""Set on the checkpoint's config by ``choose_longrope_factors``: the engine's choice, read by ``rope_parameters``."""


def choose_longrope_factors(hf_config: Any, max_model_len: int) -> None:
    """LongRoPE (Phi-3 128k style) rotates every position with one set of factors, fixed
    when the model is built, since cached keys cannot be re-rotated. As vLLM does, the long
    factors are used only when ``max_model_len`` exceeds ``original_max_position_embeddings``;
    a context capped at the original one keeps the short factors, which is what transformers
    uses for every sequence that short. Records the choice on ``hf_config``."""
    params = rope_parameters(hf_config)
    if params["rope_type"] != "longrope":
        return
    original = params["original_max_position_embeddings"]
    use_long = max_model_len > original
    setattr(hf_config, LONG_FACTORS_ATTR, use_long)
    if use_long:
        logger.warning(
            "LongRoPE: max_model_len=%d exceeds original_max_position_embeddings=%d, so every position uses the "
            "long factors, also in sequences shorter than %d (transformers uses the short factors for those, so "
            "their output differs); set model.max_model_len=%d or less to use the short factors",
            max_model_len,
            original,
            original,
            original,
        )
    elif getattr(hf_config, "max_position_embeddings", 0) > original:
        logger.warning(
            "LongRoPE: max_model_len=%d is within original_max_position_embeddings=%d, so the short factors are "
            "used; the long factors need model.max_model_len above %d",
            max_model_len,
            original,
            original,
        )


def check_rope_types(hf_config: Any) -> None:
    """Fail when the config is built, not in the worker, on a ``rope_type`` this engine lacks."""
    raw = getattr(hf_config, "rope_parameters", None) or {}
    nested = [key for key, value in raw.items() if isinstance(value, dict)]
    for layer_type in nested or [None]:
        rope_type = rope_parameters(hf_config, layer_type)["rope_type"]
        if rope_type not in ROPE_TYPES:
            key = "rope_parameters" + (f".{layer_type}" if layer_type else "") + ".rope_type"
            raise ValueError(f"model config {key}={rope_type!r}: supported are {', '.join(ROPE_TYPES)}")
