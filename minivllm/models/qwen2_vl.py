"""Qwen2-VL: a native-resolution vision transformer and a Qwen2 language model with M-RoPE.

An image of any size (the processor rounds it to multiples of 28 pixels,
within ``min_pixels`` / ``max_pixels``) becomes a ``(t, h, w)`` grid of 14-pixel
patches and ``t * h/2 * w/2`` placeholder tokens (``<|image_pad|>``, between
``<|vision_start|>`` and ``<|vision_end|>``); the vision tower
(``vision/qwen2_vl_vit.py``) turns its patches into that many embeddings,
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
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Iterable, Iterator

import torch
from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend
from minivllm.distributed.pipeline import tie_where_held, tied_head_weights
from minivllm.models.qwen2 import Qwen2ForCausalLM
from minivllm.models.utils import load_weights
from minivllm.models.vision.qwen2_vl_vit import Qwen2VisionTransformer
from minivllm.multimodal.feature import MultiModalFeature

MAX_ASPECT_RATIO = 200
"""The image processor refuses images whose long side is over 200 times the short one."""
_RENAMES = (("model.visual.", "visual."), ("model.language_model.", "model."))


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
