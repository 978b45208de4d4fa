"""Qwen2-VL's vision transformer: native-resolution patches in, merged tokens out.

The image processor cuts an image (resized to multiples of ``patch_size *
spatial_merge_size``) into a ``(t, h, w)`` grid of patches, each flattened to
``C * temporal_patch_size * P * P`` values, ordered so that every
``merge x merge`` block of neighbouring patches is consecutive. The tower:

    patches (N, C*T*P*P) -> patch embed (N, E) -> blocks (2-D RoPE, full attention
    within each frame) -> merger: LayerNorm, each merge*merge block concatenated
    (N / merge^2, E * merge^2), MLP -> (N / merge^2, hidden) language-model tokens

Attention is bidirectional inside a frame and absent across frames and images
(block-diagonal, bounded by ``cu_seqlens``). The vision tower is replicated on
every tensor-parallel rank: it is small next to the language model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.layers.activation import get_act_fn
from minivllm.layers.linear import ReplicatedLinear
from minivllm.layers.norm import LayerNorm


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
