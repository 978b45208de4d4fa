"""Rotary position embeddings (RoPE), with the scaling schemes checkpoints use.

By default cos/sin are computed per step from the token positions. Once the
model is on its device, ``share_cos_sin_caches`` computes one table of them per
distinct rotary embedding of the model (``(max_model_len, rotary_dim)``) and
hands it to every layer, so a step only looks rows up; on CUDA the rotation is
then one Triton kernel per tensor, in place (``layers.ops.rotary_inplace``).
The table holds exactly what ``_freqs`` computes, so both paths agree.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    """``{"rope_theta": ..., "rope_type": ..., **scaling}`` from old and new config layouts."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    params = {**scaling, **params}
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    params["rope_type"] = rope_type
    return params


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    factor = params["factor"]
    low, high = params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = ((old_len / wavelen) - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, blended)
    return torch.where(wavelen < old_len / high, inv_freq, out)


class RotaryEmbedding(nn.Module):
    """Rotates the first ``rotary_dim`` features of each head.

    ``neox_style`` rotates the two halves of the rotary features against each
    other (Llama, GPT-NeoX); otherwise even/odd pairs are rotated (GPT-J).
    """

    def __init__(self, head_dim: int, rotary_dim: int, params: dict[str, Any], neox_style: bool = True) -> None:
        super().__init__()
        self.head_dim, self.rotary_dim, self.neox_style = head_dim, rotary_dim, neox_style
        rope_type = params["rope_type"]
        if rope_type not in ("default", "llama3", "linear"):
            raise ValueError(f"rope_type={rope_type!r}: supported are default, llama3, linear")
        # Computed on the CPU even when the model is built under a meta-device context.
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device="cpu") / rotary_dim
        inv_freq = 1.0 / (params["rope_theta"] ** exponents)
        if rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, params)
        elif rope_type == "linear":
            inv_freq = inv_freq / params["factor"]
        self.inv_freq_values = inv_freq.float().tolist()
        self._inv_freq: torch.Tensor | None = None
        self.cos_sin_cache: torch.Tensor | None = None
        """(max_position, rotary_dim) fp32: cosines then sines per position; see ``share_cos_sin_caches``."""
        self.use_triton = True
        """Whether CUDA inputs with a cache take the in-place Triton kernel (off under torch.compile)."""

    def _freqs(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._inv_freq is None or self._inv_freq.device != positions.device:
            self._inv_freq = torch.tensor(self.inv_freq_values, dtype=torch.float32, device=positions.device)
        angles = positions.float().unsqueeze(-1) * self._inv_freq  # (T, rotary_dim / 2)
        return angles.cos(), angles.sin()

    def cache_key(self) -> tuple:
        """Embeddings with equal keys compute equal cos/sin tables."""
        return (type(self), self.rotary_dim, tuple(self.inv_freq_values))

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: (T, Hq, D), k: (T, Hk, D) -> rotated tensors of the same shapes (on CUDA with a
        cos/sin cache: ``q`` and ``k`` themselves, rotated in place)."""
        cache = self.cos_sin_cache
        if cache is None:
            cos, sin = self._freqs(positions)
        elif self.use_triton and q.is_cuda:
            from minivllm.layers.ops.rotary_inplace import rotary_embedding_

            rotary_embedding_(positions, q, k, cache, self.neox_style)
            return q, k
        else:
            cos, sin = cache[positions].chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (T, 1, rotary_dim / 2)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot, rest = x[..., : self.rotary_dim].float(), x[..., self.rotary_dim :]
        if self.neox_style:
            x1, x2 = rot.chunk(2, dim=-1)
            rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return torch.cat((rotated.to(x.dtype), rest), dim=-1)


def share_cos_sin_caches(model: nn.Module, max_positions: int, device: torch.device) -> int:
    """Give every rotary embedding of ``model`` its cos/sin table, computed once per
    distinct embedding (usually once per model); returns how many tables were made."""
    tables: dict[tuple, torch.Tensor] = {}
    positions = torch.arange(max_positions, device=device)
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            key = module.cache_key()
            if key not in tables:
                cos, sin = module._freqs(positions)  # (max_positions, rotary_dim / 2) each
                tables[key] = torch.cat((cos, sin), dim=-1).float().contiguous()
            module.cos_sin_cache = tables[key]
    return len(tables)


def get_rope(hf_config: Any, head_dim: int, rotary_dim: int | None = None, neox_style: bool = True) -> RotaryEmbedding:
    """``rotary_dim`` defaults to the config's ``partial_rotary_factor`` share of ``head_dim``
    (GPT-NeoX rotates a quarter of each head, Phi-3 all of it)."""
    params = rope_parameters(hf_config)
    if rotary_dim is None:
        factor = params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0))
        rotary_dim = int(head_dim * factor)
    return RotaryEmbedding(head_dim, rotary_dim, params, neox_style)
