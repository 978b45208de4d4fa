"""The ``rope_type`` a checkpoint names, read from its config: what ``layers/rotary.py`` builds
and what the config checks when it is built (a rope_type this engine lacks fails there).
"""

from __future__ import annotations

from typing import Any

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
    return params


def check_rope_types(hf_config: Any) -> None:
    """Fail when the config is built, not in the worker, on a ``rope_type`` this engine lacks."""
    raw = getattr(hf_config, "rope_parameters", None) or {}
    nested = [key for key, value in raw.items() if isinstance(value, dict)]
    for layer_type in nested or [None]:
        rope_type = rope_parameters(hf_config, layer_type)["rope_type"]
        if rope_type not in ROPE_TYPES:
            key = "rope_parameters" + (f".{layer_type}" if layer_type else "") + ".rope_type"
            raise ValueError(f"model config {key}={rope_type!r}: supported are {', '.join(ROPE_TYPES)}")
