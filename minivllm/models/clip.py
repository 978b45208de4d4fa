"""The CLIP vision transformer (ViT), as LLaVA and its descendants use it.

The tower is small next to the language model, so every tensor-parallel rank
holds all of it (replicated, plain ``nn.Linear``); its parameter names are
transformers' ``CLIPVisionModel`` names without the ``vision_model.`` level, so a
checkpoint loads by name. Attention is bidirectional over one image's patches.
Layers skip torch's random init: the loader fills every parameter (and random
init on the meta device costs seconds).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN


class Linear(nn.Linear):
    def reset_parameters(self) -> None:  # the checkpoint fills it
        pass


class LayerNorm(nn.LayerNorm):
    def reset_parameters(self) -> None:
        pass


class _Conv2d(nn.Conv2d):
    def reset_parameters(self) -> None:
        pass


class _Embedding(nn.Embedding):
    def reset_parameters(self) -> None:
        pass


class CLIPVisionEmbeddings(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden, patch = config.hidden_size, config.patch_size
        self.class_embedding = nn.Parameter(torch.empty(hidden))
        self.patch_embedding = _Conv2d(config.num_channels, hidden, patch, stride=patch, bias=False)
        self.num_positions = (config.image_size // patch) ** 2 + 1
        self.position_embedding = _Embedding(self.num_positions, hidden)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, 1 + patches, hidden)
        dtype = self.patch_embedding.weight.dtype
        patches = self.patch_embedding(pixel_values.to(dtype)).flatten(2).transpose(1, 2)  # (B, P, hidden)
        cls = self.class_embedding.expand(patches.shape[0], 1, -1)
        x = torch.cat([cls, patches], dim=1)
        if x.shape[1] != self.num_positions:
            raise ValueError(
                f"pixel_values: {tuple(pixel_values.shape[-2:])} image gives {x.shape[1]} positions, "
                f"the vision tower has {self.num_positions}"
            )
        return x + self.position_embedding.weight


class CLIPAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = hidden // self.num_heads
        self.q_proj, self.k_proj, self.v_proj = (Linear(hidden, hidden) for _ in range(3))
        self.out_proj = Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S, hidden)
        B, S, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, S, hidden) -> (B, heads, S, head_dim)
            return t.view(B, S, self.num_heads, self.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(B, S, -1))


class CLIPMLP(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.fc1 = Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = Linear(config.intermediate_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CLIPEncoderLayer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.layer_norm1 = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = CLIPAttention(config)
        self.layer_norm2 = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = CLIPMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(config) for _ in range(config.num_hidden_layers))


class CLIPVisionTransformer(nn.Module):
    """``hidden_states(pixel_values, layers)``: the outputs transformers lists as
    ``hidden_states`` (index 0: the embeddings after ``pre_layrnorm``; index i: after
    encoder layer i), only those asked for, running no layer past the last one needed."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embeddings = CLIPVisionEmbeddings(config)
        self.pre_layrnorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # transformers' spelling
        self.encoder = CLIPEncoder(config)
        self.post_layernorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        """Loaded with the checkpoint but unused: LLaVA reads a hidden layer, not the pooled output."""

    def hidden_states(self, pixel_values: torch.Tensor, layers: list[int]) -> list[torch.Tensor]:
        """``layers`` index ``hidden_states`` as transformers does (negative from the end)."""
        count = len(self.encoder.layers) + 1
        wanted = [i % count for i in layers]
        x = self.pre_layrnorm(self.embeddings(pixel_values))
        states = {0: x}
        for i, layer in enumerate(self.encoder.layers[: max(wanted)], start=1):
            x = layer(x)
            states[i] = x
        return [states[i] for i in wanted]
