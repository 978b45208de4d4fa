"""Qwen2-VL: a native-resolution vision transformer and a Qwen2 language model with M-RoPE.

An image of any size (the processor rounds it to multiples of 28 pixels,
within ``min_pixels`` / ``max_pixels``) becomes a ``(t, h, w)`` grid of 14-pixel
patches and ``t * h/2 * w/2`` placeholder tokens (``<|image_pad|>``, between
``<|vision_start|>`` and ``<|vision_end|>``); the vision tower
(``Qwen2VisionTransformer``, below) turns its patches into that many embeddings,
which the runner writes over the placeholders.

Positions are three-dimensional (M-RoPE, ``layers/rotary.py:MRotaryEmbedding``):
a text token has its 1-D index in all three rows; an image's tokens take
(temporal, row, column) of their merged grid, offset by the text before them;
the text after an image resumes at the image's largest position plus one. So a
prompt of L tokens spans positions up to ``L + delta - 1`` and a generated
token at 1-D index p gets ``p + delta`` in every row::

    tokens   T  T  <img 2x3 grid>      T  T
    temporal 0  1  2  2  2  2  2  2    5  6
    height   0  1  2  2  2  3  3  3    5  6
    width    0  1  2  3  4  2  3  4    5  6       delta = 7 - 10 = -3

Checkpoint names: ``visual.*`` and ``model.*`` (what transformers writes) or its
in-memory ``model.visual.*`` / ``model.language_model.*``; ``lm_head.*`` in both.

The vision transformer: native-resolution patches in, merged tokens out. The image
processor cuts an image (resized to multiples of ``patch_size * spatial_merge_size``)
into a ``(t, h, w)`` grid of patches, each flattened to ``C * temporal_patch_size *
P * P`` values, ordered so that every ``merge x merge`` block of neighbouring patches
is consecutive. The tower::

    patches (N, C*T*P*P) -> patch embed (N, E) -> blocks (2-D RoPE, full attention
    within each frame) -> merger: LayerNorm, each merge*merge block concatenated
    (N / merge^2, E * merge^2), MLP -> (N / merge^2, hidden) language-model tokens

Attention is bidirectional inside a frame and absent across frames and images
(block-diagonal, bounded by ``cu_seqlens``). The vision tower is replicated on
every tensor-parallel rank: it is small next to the language model.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend
from minivllm.distributed.pipeline import tie_where_held, tied_head_weights
from minivllm.layers.activation import get_act_fn
from minivllm.layers.linear import ReplicatedLinear
from minivllm.layers.norm import LayerNorm
from minivllm.models.qwen2 import Qwen2ForCausalLM
from minivllm.models.utils import load_weights
from minivllm.multimodal.feature import MultiModalFeature

MAX_ASPECT_RATIO = 200
"""The image processor refuses images whose long side is over 200 times the short one."""
_RENAMES = (("model.visual.", "visual."), ("model.language_model.", "model."))


class FlatPatchLinear(ReplicatedLinear):
    """A Conv3d whose kernel equals its stride, applied to one flattened patch each, is
    this linear map; the checkpoint's (E, C, T, P, P) kernel loads as (E, C*T*P*P)."""

    def weight_loader(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        tensor = loaded if isinstance(loaded, torch.Tensor) else loaded[...]
        super().weight_loader(param, tensor.reshape(param.shape), shard_id)


class PatchEmbed(nn.Module):
    def __init__(self, patch_features: int, embed_dim: int) -> None:
        super().__init__()
        self.proj = FlatPatchLinear(patch_features, embed_dim, bias=False)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:  # (N, C*T*P*P) -> (N, E)
        return self.proj(patches.to(self.proj.weight.dtype))


def rotate_2d(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, H, D); cos, sin (N, D / 2): the halves of each head rotated against each other, in fp32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class VisionAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv = ReplicatedLinear(dim, 3 * dim, bias=True)
        self.proj = ReplicatedLinear(dim, dim, bias=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: list[int]) -> torch.Tensor:
        N = x.shape[0]
        q, k, v = self.qkv(x).view(N, 3, self.num_heads, self.head_dim).unbind(1)  # (N, H, D) each
        q, k = rotate_2d(q, cos, sin), rotate_2d(k, cos, sin)
        return self.proj(frame_attention(q, k, v, cu_seqlens).reshape(N, -1))


def frame_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: list[int]) -> torch.Tensor:
    """Bidirectional attention inside each frame (block-diagonal by ``cu_seqlens``): q, k, v
    (N, H, D) -> (N, H, D). Frames of equal length share one batched call, so a step's images
    of one size cost one call per block, not one per image."""
    out = torch.empty_like(q)
    starts_by_len: dict[int, list[int]] = {}
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        starts_by_len.setdefault(end - start, []).append(start)
    H, D = q.shape[1:]
    for n, starts in starts_by_len.items():
        if len(starts_by_len) == 1:  # every frame this long: the rows as they are
            rows: torch.Tensor | slice = slice(None)
        else:
            rows = (torch.tensor(starts, device=q.device)[:, None] + torch.arange(n, device=q.device)).flatten()
        heads_first = [t[rows].view(len(starts), n, H, D).transpose(1, 2) for t in (q, k, v)]  # (B, H, n, D)
        out[rows] = F.scaled_dot_product_attention(*heads_first).transpose(1, 2).reshape(-1, H, D)
    return out


class VisionMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str) -> None:
        super().__init__()
        self.fc1 = ReplicatedLinear(dim, hidden, bias=True)
        self.fc2 = ReplicatedLinear(hidden, dim, bias=True)
        self.act = get_act_fn(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class VisionBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_hidden: int, act: str) -> None:
        super().__init__()
        self.norm1 = LayerNorm(dim, eps=1e-6)
        self.norm2 = LayerNorm(dim, eps=1e-6)
        self.attn = VisionAttention(dim, num_heads)
        self.mlp = VisionMLP(dim, mlp_hidden, act)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cu_seqlens: list[int]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, cu_seqlens)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """LayerNorm, then each ``merge x merge`` block of patches (consecutive rows) as one
    token through a two-layer GELU MLP. ``mlp.0`` / ``mlp.2`` are the checkpoint's names."""

    def __init__(self, out_dim: int, embed_dim: int, merge: int) -> None:
        super().__init__()
        self.merged_dim = embed_dim * merge * merge
        self.ln_q = LayerNorm(embed_dim, eps=1e-6)
        self.mlp = nn.Sequential(
            ReplicatedLinear(self.merged_dim, self.merged_dim, bias=True),
            nn.GELU(),
            ReplicatedLinear(self.merged_dim, out_dim, bias=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, E) -> (N / merge^2, out_dim)
        return self.mlp(self.ln_q(x).view(-1, self.merged_dim))


class Qwen2VisionTransformer(nn.Module):
    def __init__(self, vision_config: Any) -> None:
        super().__init__()
        c = vision_config
        self.merge = c.spatial_merge_size
        patch_features = c.in_channels * c.temporal_patch_size * c.patch_size * c.patch_size
        self.patch_embed = PatchEmbed(patch_features, c.embed_dim)
        mlp_hidden = int(c.embed_dim * c.mlp_ratio)
        self.blocks = nn.ModuleList(
            VisionBlock(c.embed_dim, c.num_heads, mlp_hidden, c.hidden_act) for _ in range(c.depth)
        )
        self.merger = PatchMerger(c.hidden_size, c.embed_dim, self.merge)
        head_dim = c.embed_dim // c.num_heads
        theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        axis_dim = head_dim // 2  # each axis (height, width) rotates a quarter of the head's pairs
        self.inv_freq_values = [1.0 / theta ** (i / axis_dim) for i in range(0, axis_dim, 2)]

    def forward(self, pixel_values: torch.Tensor, grid_thw: list[tuple[int, int, int]]) -> torch.Tensor:
        """pixel_values (N, C*T*P*P), the patches of the images with ``grid_thw`` in order
        -> (N / merge^2, hidden): each image's tokens in the same order."""
        x = self.patch_embed(pixel_values)  # (N, E)
        cos, sin = self._rotary(grid_thw, x.device)
        cu_seqlens = self._frame_bounds(grid_thw)
        for block in self.blocks:
            x = block(x, cos, sin, cu_seqlens)
        return self.merger(x)

    def _rotary(self, grid_thw: list[tuple[int, int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (N, head_dim / 2): a patch's height angles, then its width angles."""
        hw = torch.cat([self._patch_rows_cols(t, h, w, device) for t, h, w in grid_thw])  # (N, 2)
        inv_freq = torch.tensor(self.inv_freq_values, dtype=torch.float32, device=device)
        angles = (hw.unsqueeze(-1).float() * inv_freq).flatten(1)  # (N, 2 * head_dim / 4)
        return angles.cos(), angles.sin()

    def _patch_rows_cols(self, t: int, h: int, w: int, device: torch.device) -> torch.Tensor:
        """(t*h*w, 2) each patch's (row, column) in the processor's order: merge blocks in
        row-major order, row-major within a block, frame after frame."""
        m = self.merge
        rows = torch.arange(h, device=device).view(h // m, m, 1, 1).expand(h // m, m, w // m, m)
        cols = torch.arange(w, device=device).view(1, 1, w // m, m).expand(h // m, m, w // m, m)
        block_major = [a.transpose(1, 2).flatten() for a in (rows, cols)]
        return torch.stack(block_major, dim=-1).repeat(t, 1)

    @staticmethod
    def _frame_bounds(grid_thw: list[tuple[int, int, int]]) -> list[int]:
        """Cumulative patch counts at each frame's end, from 0: attention stays inside a frame."""
        bounds = [0]
        for t, h, w in grid_thw:
            bounds.extend(bounds[-1] + h * w * (i + 1) for i in range(t))
        return bounds


def checkpoint_name(name: str) -> str:
    """Either transformers spelling of a Qwen2-VL tensor name -> this module's name."""
    for old, new in _RENAMES:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


class Qwen2VLForConditionalGeneration(Qwen2ForCausalLM):
    """The language model is ``Qwen2ForCausalLM`` over ``text_config`` (its modules keep the
    checkpoint's ``model.*`` / ``lm_head`` names, and its ``forward`` and ``embed_input_ids``
    serve as they are); the vision tower sits beside it as ``visual``. ``forward``'s positions
    are (3, T) M-RoPE positions, or (T,) for text only (equal rows)."""

    supports_multimodal: ClassVar[bool] = True
    batches_multimodal: ClassVar[bool] = True
    supports_mrope: ClassVar[bool] = True
    supports_pp: ClassVar[bool] = False

    def __init__(self, config: PretrainedConfig, backend: AttentionBackend, **layer_opts: Any) -> None:
        super().__init__(config.text_config, backend, **layer_opts)
        self.vl_config = config
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:  # the flag lives on the outer config
            tie_where_held(self.lm_head, self.model.embed_tokens)
        self.visual = Qwen2VisionTransformer(config.vision_config)
        self.spatial_merge_size = config.vision_config.spatial_merge_size

    @classmethod
    def image_token_id(cls, hf_config: PretrainedConfig) -> int:
        return int(hf_config.image_token_id)

    @classmethod
    def profile_image_size(
        cls, hf_config: PretrainedConfig, image_processor: Any, max_tokens: int
    ) -> tuple[int, int] | None:
        return largest_image_size(image_processor, max_tokens)

    def embed_multimodal(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor, **_: Any) -> torch.Tensor:
        """B images, any sizes: pixel_values (sum of t*h*w, C*T*P*P), their patches one image
        after the other; image_grid_thw (B, 3) -> (sum of t*h*w / merge^2, hidden), in placeholder
        order. Attention stays inside each image's frames (the tower's cu_seqlens)."""
        grid = [tuple(int(v) for v in row) for row in image_grid_thw.reshape(-1, 3).tolist()]
        patches = sum(t * h * w for t, h, w in grid)
        if pixel_values.shape[0] != patches:
            raise ValueError(f"pixel_values has {pixel_values.shape[0]} patches; image_grid_thw {grid} needs {patches}")
        return self.visual(pixel_values, grid)

    def get_mrope_input_positions(
        self, prompt_token_ids: list[int], mm_features: list[MultiModalFeature]
    ) -> tuple[torch.Tensor, int]:
        return mrope_input_positions(len(prompt_token_ids), mm_features, self.spatial_merge_size)

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        stream: Iterator[tuple[str, Any]] = ((checkpoint_name(n), t) for n, t in weights)
        if self.tie_word_embeddings:
            stream = tied_head_weights(stream, "model.embed_tokens.weight", self.lm_head, self.model.embed_tokens)
        load_weights(self, stream, self.packed_modules_mapping, ("rotary_emb.inv_freq",))


def largest_image_size(image_processor: Any, max_tokens: int) -> tuple[int, int] | None:
    """(width, height) of the image with the most placeholder tokens, at most ``max_tokens``, that
    the image processor keeps as it is: sides in multiples of ``patch_size * merge_size`` pixels
    (one token each way), the area within its ``[min_pixels, max_pixels]``, the aspect ratio
    within 200; of those, the squarest."""
    unit = image_processor.patch_size * image_processor.merge_size
    min_pixels, max_pixels = _pixel_bounds(image_processor)
    tokens = min(max_tokens, max_pixels // unit**2)
    best: tuple[int, int] | None = None  # (rows, columns) of merged tokens
    for rows in range(1, math.isqrt(max(tokens, 0)) + 1):
        cols = tokens // rows
        if cols <= MAX_ASPECT_RATIO * rows and rows * cols * unit**2 >= min_pixels:
            if best is None or rows * cols >= best[0] * best[1]:
                best = (rows, cols)
    return None if best is None else (best[1] * unit, best[0] * unit)


def _pixel_bounds(image_processor: Any) -> tuple[int, int]:
    """(min_pixels, max_pixels): attributes of older transformers, ``size``'s shortest and
    longest edge (in pixels of area) of newer ones."""
    low, high = getattr(image_processor, "min_pixels", None), getattr(image_processor, "max_pixels", None)
    if low is None or high is None:
        size = image_processor.size
        get = size.get if isinstance(size, dict) else lambda key: getattr(size, key, None)
        low, high = get("shortest_edge"), get("longest_edge")
    return int(low), int(high)


def mrope_input_positions(
    num_tokens: int, features: list[MultiModalFeature], spatial_merge_size: int
) -> tuple[torch.Tensor, int]:
    """(3, L) int64 positions of a prompt of ``num_tokens`` tokens whose images are ``features``
    (by offset), and delta (``max position + 1 - L``): see the module docstring."""
    rows: list[torch.Tensor] = []
    next_pos, cursor = 0, 0  # the position the next token starts at; the prompt index it is at
    for feature in sorted(features, key=lambda f: f.offset):
        if feature.offset < cursor:
            raise ValueError(f"image {feature.identifier} at offset {feature.offset} overlaps the image before it")
        rows.append(torch.arange(feature.offset - cursor).expand(3, -1) + next_pos)  # the text before it
        next_pos += feature.offset - cursor
        grid = _image_grid(feature, spatial_merge_size)  # (3, length)
        rows.append(grid + next_pos)
        next_pos += int(grid.max()) + 1
        cursor = feature.end
    if cursor > num_tokens:
        raise ValueError(f"image placeholders run to {cursor}, past the prompt's {num_tokens} tokens")
    rows.append(torch.arange(num_tokens - cursor).expand(3, -1) + next_pos)
    # the last position is next_pos + (num_tokens - cursor) - 1, so delta = next_pos - cursor
    return torch.cat(rows, dim=1).long(), next_pos - cursor


def _image_grid(feature: MultiModalFeature, merge: int) -> torch.Tensor:
    """(3, t * h/merge * w/merge): the (temporal, row, column) of each merged token, row-major."""
    t, h, w = (int(v) for v in feature.data["image_grid_thw"].reshape(-1)[:3])
    h, w = h // merge, w // merge
    if t * h * w != feature.length:
        raise ValueError(
            f"image {feature.identifier}: {feature.length} placeholder tokens, but its grid "
            f"(t={t}, h={h}, w={w} merged) has {t * h * w}"
        )
    grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
    return grid.reshape(3, -1)
