"""Several images in one vision-encoder call: which processed images go together, and their tensors joined.

A model that ``batches_multimodal`` takes, in one ``embed_multimodal`` call, the tensors of
several images concatenated along dim 0, and returns their embedding rows concatenated in
the same order:

    LLaVA      pixel_values (1, 3, H, W) each      -> (B, 3, H, W): the images must share H, W
    Qwen2-VL   pixel_values (patches_i, C*T*P*P)   -> (sum of patches, C*T*P*P), any sizes;
               image_grid_thw (1, 3) each          -> (B, 3): the ViT keeps images apart by cu_seqlens

So images join one call when every tensor agrees with the others' beyond dim 0 (the same
keys, dtypes and trailing shapes); a model without the capability gets one image per call.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch

from minivllm.multimodal.feature import MultiModalFeature


def encoder_batches(features: Sequence[MultiModalFeature], batched: bool) -> list[list[int]]:
    """Indices into ``features``, one list per encoder call, in first-appearance order: images
    whose tensors join along dim 0 share a call (when ``batched``), the rest go alone."""
    if not batched:
        return [[i] for i in range(len(features))]
    groups: dict[Hashable, list[int]] = {}
    for i, feature in enumerate(features):
        groups.setdefault(_join_key(feature, i), []).append(i)
    return list(groups.values())


def joined_data(features: Sequence[MultiModalFeature]) -> dict[str, torch.Tensor]:
    """The images' tensors concatenated along dim 0 (one image's tensors as they are)."""
    if len(features) == 1:
        return dict(features[0].data)
    return {key: torch.cat([f.data[key] for f in features]) for key in features[0].data}


def _join_key(feature: MultiModalFeature, index: int) -> Hashable:
    """Equal for images that concatenate; a 0-d tensor joins nothing (keyed by its index)."""
    if any(t.dim() == 0 for t in feature.data.values()):
        return ("alone", index)
    return tuple(sorted((key, t.dtype, tuple(t.shape[1:])) for key, t in feature.data.items()))
