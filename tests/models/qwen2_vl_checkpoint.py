"""A tiny random Qwen2-VL: transformers config and model, and helpers shared by its tests."""

from __future__ import annotations

import torch
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

from minivllm.multimodal.feature import MultiModalFeature

IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 5, 6, 7, 8
MERGE = 2
PATCH_FEATURES = 3 * 2 * 14 * 14  # channels * temporal_patch_size * patch_size^2


def tiny_qwen2_vl_config(vocab_size: int = 600, tie: bool = False, **ids: int) -> Qwen2VLConfig:
    """Two text layers with GQA and an mrope_section over a head of 16 (8 frequencies); a
    two-block vision tower of width 32. ``ids`` overrides the special token ids."""
    text = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    )
    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, spatial_merge_size=MERGE)
    special = dict(
        image_token_id=IMAGE_TOKEN,
        video_token_id=VIDEO_TOKEN,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )
    config = Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie, **{**special, **ids})
    config.architectures = ["Qwen2VLForConditionalGeneration"]
    return config


def tiny_hf_model(config: Qwen2VLConfig, seed: int = 0) -> Qwen2VLForConditionalGeneration:
    """Random weights, spread wide enough that the vision tower's output matters."""
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "ln_q" in name:
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen) if name.endswith("weight") else 0.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.08)
    return model


def image_prompt(text_lens: list[int], grids: list[tuple[int, int, int]], seed: int = 0) -> tuple[list[int], list]:
    """Token ids: text runs of ``text_lens`` (one more than images) around each image's
    ``<|vision_start|> <|image_pad|> * n <|vision_end|>``; and one feature per image (no pixels)."""
    gen = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    features = []
    for i, n in enumerate(text_lens):
        ids += torch.randint(10, 500, (n,), generator=gen).tolist()
        if i < len(grids):
            t, h, w = grids[i]
            length = t * h * w // MERGE**2
            ids.append(VISION_START)
            grid = torch.tensor([[t, h, w]])
            features.append(MultiModalFeature(f"img{i}", "image", len(ids), length, {"image_grid_thw": grid}))
            ids += [IMAGE_TOKEN] * length + [VISION_END]
    return ids, features
