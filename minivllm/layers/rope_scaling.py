"""RoPE frequencies for each ``rope_type`` a checkpoint can name.

Every scheme starts from the default inverse frequencies
``theta ** (-2i / rotary_dim)`` and reshapes them; some also scale cos/sin
(``attention_factor``). The frequencies are fixed once the model is built, so
the keys in the paged KV cache never need re-rotating:

- ``dynamic`` (NTK) uses the base it would have at its full scaled context
  (``factor * max_position_embeddings``), as vLLM does, instead of
  re-deriving it from each batch's longest sequence as transformers does.
- ``longrope`` (Phi-3/3.5 128k, Phi-4-mini) uses its long factors at every
  position when the engine's context (``max_model_len``, chosen in
  ``config/rope.py``; without an engine config, the checkpoint's
  ``max_position_embeddings``) exceeds ``original_max_position_embeddings``,
  its short factors otherwise, as vLLM does. transformers picks per forward
  pass (long once the sequence is longer than the original context), which
  would leave keys cached with short factors wrong once a sequence crosses it.
  A context capped at the original one therefore matches transformers exactly,
  as do sequences longer than it; with a longer context, shorter sequences use
  the long factors here. The attention factor always follows the checkpoint's
  context, as in transformers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from minivllm.config.model import ROPE_TYPES


@dataclass(frozen=True)
class RopeFrequencies:
    inv_freq: list[float]
    """(rotary_dim / 2,) angle per position of each rotated pair."""
    attention_factor: float = 1.0
    """Multiplies cos and sin (YaRN's and LongRoPE's attention scaling)."""


def compute_frequencies(params: dict[str, Any], rotary_dim: int, max_position_embeddings: int) -> RopeFrequencies:
    """``params`` is one flat ``rope_parameters`` dict (``rope_type``, ``rope_theta``, scaling keys)."""
    rope_type = params["rope_type"]
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type={rope_type!r}: supported are {', '.join(ROPE_TYPES)}")
    # Computed on the CPU in float64 even when the model is built under a meta-device context.
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device="cpu") / rotary_dim  # (rotary_dim / 2,)
    theta = float(params["rope_theta"])
    if rope_type == "dynamic":
        factor = params["factor"]
        theta *= (factor * factor - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
    inv_freq = 1.0 / (theta**exponents)
    if rope_type == "linear":
        return RopeFrequencies((inv_freq / params["factor"]).tolist())
    if rope_type == "llama3":
        return RopeFrequencies(_llama3(inv_freq, params).tolist())
    if rope_type == "yarn":
        return _yarn(inv_freq, params, rotary_dim, theta, max_position_embeddings)
    if rope_type == "longrope":
        return _longrope(inv_freq, params, max_position_embeddings)
    return RopeFrequencies(inv_freq.tolist())


def _llama3(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    factor = params["factor"]
    low, high = params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = ((old_len / wavelen) - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, blended)
    return torch.where(wavelen < old_len / high, inv_freq, out)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(
    inv_freq: torch.Tensor, params: dict[str, Any], dim: int, theta: float, max_position_embeddings: int
) -> RopeFrequencies:
    """Pairs that turn more than ``beta_fast`` times over the original context keep
    their frequency, those turning fewer than ``beta_slow`` times are divided by
    ``factor``, and a linear ramp over pair index blends the ones between."""
    old_len = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_position_embeddings / old_len
    attention = params.get("attention_factor")
    if attention is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all:
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        else:
            attention = _yarn_mscale(factor)

    def pair_index(rotations: float) -> float:  # the (fractional) pair that turns `rotations` times over old_len
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_index(params.get("beta_fast") or 32), pair_index(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pairs = torch.arange(dim // 2, dtype=torch.float64, device="cpu")
    ramp = ((pairs - low) / (high - low)).clamp(0, 1)  # (dim / 2,) 0: keep the frequency, 1: divide it
    blended = inv_freq / factor * ramp + inv_freq * (1 - ramp)
    return RopeFrequencies(blended.tolist(), float(attention))


def _longrope(inv_freq: torch.Tensor, params: dict[str, Any], max_position_embeddings: int) -> RopeFrequencies:
    old_len = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_position_embeddings / old_len
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old_len))
    use_long = params.get("use_long_factors", max_position_embeddings > old_len)
    factors = params["long_factor"] if use_long else params["short_factor"]
    factors = torch.tensor(factors, dtype=torch.float64, device="cpu")  # (rotary_dim / 2,)
    return RopeFrequencies((inv_freq / factors).tolist(), float(attention))
