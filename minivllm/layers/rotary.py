"""Rotary position embeddings (RoPE), with the scaling schemes checkpoints use.

By default cos/sin are computed per step from the token positions. Once the
model is on its device, ``share_cos_sin_caches`` computes one table of them per
distinct rotary embedding of the model (``(max_model_len, rotary_dim)``) and
hands it to every layer, so a step only looks rows up; on CUDA the rotation is
then one Triton kernel per tensor, in place (``layers.ops.rotary_inplace``).
The table holds exactly what ``cos_sin`` computes, so both paths agree. Off
CUDA a second shared table lays cosines and signed sines out like the features
they multiply, so a whole-head fp32 rotation (of q and k together, where they
sit side by side in a fused qkv) is ``x * cos + swap(x) * signed_sin``.

The frequencies of each ``rope_type`` a checkpoint can name (``compute_frequencies``):
every scheme starts from the default inverse frequencies ``theta ** (-2i / rotary_dim)``
and reshapes them; some also scale cos/sin (``attention_factor``). The frequencies are fixed once the model is built, so
the keys in the paged KV cache never need re-rotating:

- ``dynamic`` (NTK) uses the base it would have at its full scaled context
  (``factor * max_position_embeddings``), as vLLM does, instead of
  re-deriving it from each batch's longest sequence as transformers does.
- ``longrope`` (Phi-3/3.5 128k, Phi-4-mini) uses its long factors at every
  position when the engine's context (``max_model_len``, chosen in
  ``config/model.py``; without an engine config, the checkpoint's
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
from torch import nn

from minivllm.config.model import ROPE_TYPES, rope_parameters


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


class RotaryEmbedding(nn.Module):
    """Rotates the first ``rotary_dim`` features of each head.

    ``neox_style`` rotates the two halves of the rotary features against each
    other (Llama, GPT-NeoX); otherwise even/odd pairs are rotated (GPT-J).
    """

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        params: dict[str, Any],
        neox_style: bool = True,
        max_position_embeddings: int | None = None,
    ) -> None:
        super().__init__()
        self.head_dim, self.rotary_dim, self.neox_style = head_dim, rotary_dim, neox_style
        if max_position_embeddings is None:
            max_position_embeddings = params.get("original_max_position_embeddings") or 2048
        self.freqs: RopeFrequencies = compute_frequencies(params, rotary_dim, max_position_embeddings)
        self._inv_freq: torch.Tensor | None = None  # (rotary_dim / 2,)
        self.cos_sin_cache: torch.Tensor | None = None
        """(max_position, rotary_dim) fp32: cosines then sines per position; see ``share_cos_sin_caches``."""
        self.rotation_table: torch.Tensor | None = None
        """(max_position, 2, rotary_dim) fp32 for the torch path off CUDA: each position's cosine
        and signed sine laid out like the features they multiply (``_rotate_by_table``)."""
        self.rotation_swap: torch.Tensor | None = None
        """(rotary_dim,) int64 set with ``rotation_table``: the feature each feature is paired with."""
        self.use_triton = True
        """Whether CUDA inputs with a cache take the in-place Triton kernel (off under torch.compile)."""

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: (T,) -> cos, sin: (T, rotary_dim / 2), attention factor applied."""
        if self._inv_freq is None or self._inv_freq.device != positions.device:
            self._inv_freq = torch.tensor(self.freqs.inv_freq, dtype=torch.float32, device=positions.device)
        angles = positions.float().unsqueeze(-1) * self._inv_freq  # (T, rotary_dim / 2)
        cos, sin = angles.cos(), angles.sin()
        if self.freqs.attention_factor != 1.0:
            cos, sin = cos * self.freqs.attention_factor, sin * self.freqs.attention_factor
        return cos, sin

    def cache_key(self) -> tuple:
        """Embeddings with equal keys compute equal cos/sin tables."""
        return (type(self), self.rotary_dim, tuple(self.freqs.inv_freq), self.freqs.attention_factor)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: (T, Hq, D), k: (T, Hk, D) -> rotated tensors of the same shapes (on CUDA with a
        cos/sin cache: ``q`` and ``k`` themselves, rotated in place)."""
        cache = self.cos_sin_cache
        if cache is None:
            cos, sin = self.cos_sin(positions)
        elif self.use_triton and q.is_cuda:
            from minivllm.layers.ops.rotary_inplace import rotary_embedding_

            rotary_embedding_(positions, q, k, cache, self.neox_style)
            return q, k
        elif self._takes_table(q):
            return self._rotate_by_table(positions, q), self._rotate_by_table(positions, k)
        else:
            cos, sin = cache[positions].chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (T, 1, rotary_dim / 2)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def forward_qk(
        self, positions: torch.Tensor, qk: torch.Tensor, num_q_heads: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward`` on q and k stored side by side: qk (T, Hq + Hk, D), the first
        ``num_q_heads`` heads being q (a view into a fused qkv projection). Where the
        rotation table applies, both are rotated by one set of ops."""
        if self.cos_sin_cache is not None and not (self.use_triton and qk.is_cuda) and self._takes_table(qk):
            out = self._rotate_by_table(positions, qk)  # (T, Hq + Hk, D)
            return out[:, :num_q_heads], out[:, num_q_heads:]
        return self.forward(positions, qk[:, :num_q_heads], qk[:, num_q_heads:])

    def _takes_table(self, x: torch.Tensor) -> bool:
        return self.rotation_table is not None and self.rotary_dim == x.shape[-1] and x.dtype == torch.float32

    def _rotate_by_table(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The whole-head fp32 rotation as ``x * cos + swap(x) * signed_sin``, where ``swap``
        exchanges the two features of each rotated pair. Each output is then
        ``x1 * cos + x2 * (-sin)`` or ``x2 * cos + x1 * sin``: the bits of ``_rotate_pairs``
        (negation is exact), in four ops instead of seven. ``swap`` is one ``index_select``
        of the features: a third of what ``flip`` over a pairs view costs on the CPU."""
        table = self.rotation_table[positions].unsqueeze(2)  # (T, 2, 1, D)
        swapped = x.index_select(-1, self.rotation_swap)  # (T, H, D)
        return x * table[:, 0] + swapped * table[:, 1]

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.rotary_dim == x.shape[-1] and x.dtype == torch.float32:
            return self._rotate_pairs(x, cos, sin)  # the whole head in fp32: nothing to split off or cast
        rot, rest = x[..., : self.rotary_dim].float(), x[..., self.rotary_dim :]
        return torch.cat((self._rotate_pairs(rot, cos, sin).to(x.dtype), rest), dim=-1)

    def _rotate_pairs(self, rot: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """rot: (T, H, rotary_dim) fp32 -> rotated, same shape."""
        if self.neox_style:
            x1, x2 = rot.chunk(2, dim=-1)
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


class MRotaryEmbedding(RotaryEmbedding):
    """Multimodal RoPE (Qwen2-VL): the rotary frequencies split into three sections
    (``mrope_section``, summing to ``rotary_dim / 2``), the first rotated by a token's
    temporal position, the second by its height, the third by its width.

    ``positions`` is (3, T): rows temporal, height, width. A text token has one
    position in all three rows, and then the rotation is plain RoPE; so (T,)
    positions take the parent's path unchanged (a text-only forward, the profile run).
    """

    def __init__(self, head_dim: int, rotary_dim: int, params: dict[str, Any], mrope_section: list[int], **kw) -> None:
        super().__init__(head_dim, rotary_dim, params, **kw)
        if sum(mrope_section) != rotary_dim // 2 or len(mrope_section) != 3:
            raise ValueError(
                f"rope_parameters.mrope_section={list(mrope_section)}: expected three sections summing to "
                f"rotary_dim / 2 = {rotary_dim // 2}"
            )
        self.mrope_section = list(mrope_section)

    def cache_key(self) -> tuple:
        return (*super().cache_key(), tuple(self.mrope_section))

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.dim() == 1:
            return super().forward(positions, q, k)
        cos, sin = self._sectioned_cos_sin(positions)  # (T, rotary_dim / 2) each
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def forward_qk(
        self, positions: torch.Tensor, qk: torch.Tensor, num_q_heads: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.dim() == 1:
            return super().forward_qk(positions, qk, num_q_heads)
        return self.forward(positions, qk[:, :num_q_heads], qk[:, num_q_heads:])

    def _sectioned_cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (3, T) -> cos, sin (T, rotary_dim / 2): section i of the frequencies
        takes its angles from row i."""
        if self.cos_sin_cache is not None:
            cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)  # (3, T, rotary_dim / 2) each
        else:
            cos, sin = self.cos_sin(positions)
        return self._by_section(cos), self._by_section(sin)

    def _by_section(self, table: torch.Tensor) -> torch.Tensor:  # (3, T, rotary_dim / 2) -> (T, rotary_dim / 2)
        return torch.cat([part[row] for row, part in enumerate(table.split(self.mrope_section, dim=-1))], dim=-1)


def share_cos_sin_caches(model: nn.Module, max_positions: int, device: torch.device) -> int:
    """Give every rotary embedding of ``model`` its cos/sin table, computed once per
    distinct embedding (usually once per model); returns how many tables were made.
    Off CUDA each also gets the torch path's rotation table, shared likewise."""
    tables: dict[tuple, torch.Tensor] = {}
    rotation_tables: dict[tuple, torch.Tensor] = {}
    positions = torch.arange(max_positions, device=device)
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            key = module.cache_key()
            if key not in tables:
                cos, sin = module.cos_sin(positions)  # (max_positions, rotary_dim / 2) each
                tables[key] = torch.cat((cos, sin), dim=-1).float().contiguous()
            module.cos_sin_cache = tables[key]
            module.rotation_table = module.rotation_swap = None  # none on CUDA (the Triton kernel reads the cache)
            if device.type != "cuda":
                style = (key, module.neox_style)
                if style not in rotation_tables:
                    rotation_tables[style] = _rotation_table(tables[key], module.neox_style)
                module.rotation_table = rotation_tables[style]
                module.rotation_swap = _swap_index(module.rotary_dim, module.neox_style, device)
    return len(tables)


def _rotation_table(cos_sin: torch.Tensor, neox_style: bool) -> torch.Tensor:
    """(P, rotary_dim) cosines then sines -> (P, 2, rotary_dim): cosines and signed sines
    (``-sin`` for a pair's first feature, ``sin`` for its second) in the features' layout."""
    cos, sin = cos_sin.chunk(2, dim=-1)  # (P, rotary_dim / 2) each
    if neox_style:  # pairs are (i, i + rotary_dim / 2)
        cos_full, sin_full = torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)
    else:  # pairs are (2i, 2i + 1)
        cos_full, sin_full = cos.repeat_interleave(2, -1), torch.stack((-sin, sin), -1).flatten(-2)
    return torch.stack((cos_full, sin_full), dim=1).contiguous()


def _swap_index(rotary_dim: int, neox_style: bool, device: torch.device) -> torch.Tensor:
    """(rotary_dim,) the partner of each feature: ``i + rotary_dim / 2`` and back (neox), or
    the other feature of the even/odd pair (GPT-J)."""
    features = torch.arange(rotary_dim, device=device)
    if neox_style:
        return features.roll(rotary_dim // 2)
    return features ^ 1


def get_rope(
    hf_config: Any,
    head_dim: int,
    rotary_dim: int | None = None,
    neox_style: bool = True,
    layer_type: str | None = None,
) -> RotaryEmbedding:
    """``rotary_dim`` defaults to the config's ``partial_rotary_factor`` share of ``head_dim``
    (GPT-NeoX rotates a quarter of each head, Phi-3 all of it)."""
    params = rope_parameters(hf_config, layer_type)
    if rotary_dim is None:
        factor = params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None)) or 1.0
        rotary_dim = int(head_dim * factor)
    max_pos = getattr(hf_config, "max_position_embeddings", None)
    if params.get("mrope_section"):
        return MRotaryEmbedding(
            head_dim,
            rotary_dim,
            params,
            params["mrope_section"],
            neox_style=neox_style,
            max_position_embeddings=max_pos,
        )
    return RotaryEmbedding(head_dim, rotary_dim, params, neox_style, max_pos)
