"""A tiny random Qwen2-VL (built by ``tools/tiny_vlm.py``) and helpers shared by its tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import Qwen2VLForConditionalGeneration

from minivllm.multimodal.feature import MultiModalFeature
from tests.multimodal.vlm_greedy import Greedy, hf_greedy
from tools.tiny_vlm import (  # noqa: F401 (the builders live with the tool; tests import them from here)
    QWEN2_VL_CHAT_TEMPLATE,
    QWEN2_VL_IMAGE_TOKEN,
    QWEN2_VL_MAX_PIXELS,
    QWEN2_VL_MERGE,
    QWEN2_VL_MIN_PIXELS,
    QWEN2_VL_SPECIAL_TOKENS,
    QWEN2_VL_VIDEO_TOKEN,
    QWEN2_VL_VISION,
    QWEN2_VL_VISION_END,
    QWEN2_VL_VISION_START,
    build_qwen2_vl,
    tiny_qwen2_vl_config,
    tiny_qwen2_vl_model,
)

IMAGE_TOKEN, VIDEO_TOKEN = QWEN2_VL_IMAGE_TOKEN, QWEN2_VL_VIDEO_TOKEN
VISION_START, VISION_END = QWEN2_VL_VISION_START, QWEN2_VL_VISION_END
MERGE = QWEN2_VL_MERGE
PATCH_FEATURES = 3 * 2 * 14 * 14  # channels * temporal_patch_size * patch_size^2
SPECIAL_TOKENS, VISION, CHAT_TEMPLATE = QWEN2_VL_SPECIAL_TOKENS, QWEN2_VL_VISION, QWEN2_VL_CHAT_TEMPLATE
MIN_PIXELS, MAX_PIXELS = QWEN2_VL_MIN_PIXELS, QWEN2_VL_MAX_PIXELS
tiny_hf_model = tiny_qwen2_vl_model
ONE_IMAGE = f"user: {VISION}what is this?\nassistant:"
TWO_IMAGES = f"user: compare {VISION}with {VISION}please\nassistant:"


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


def random_image(seed: int, height: int, width: int) -> Image.Image:
    return Image.fromarray(np.random.RandomState(seed).randint(0, 255, (height, width, 3), dtype=np.uint8))


def parity_prompts() -> list[tuple[str, list[Image.Image]]]:
    """One image of each of three sizes, and two images of different sizes in one prompt."""
    small, wide, tall = random_image(0, 56, 56), random_image(1, 56, 84), random_image(2, 112, 84)
    return [(ONE_IMAGE, [small]), (ONE_IMAGE, [tall]), (TWO_IMAGES, [wide, tall]), (TWO_IMAGES, [tall, small])]


class HFQwen2VL:
    """The oracle: transformers' image processor and ``generate`` on the saved checkpoint. Each
    ``<|image_pad|>`` of the text becomes ``t * h * w / 4`` of them, as transformers' processor
    expands it (which itself needs torchvision to be built)."""

    def __init__(self, checkpoint: Path, device: str = "cpu") -> None:
        from transformers import AutoImageProcessor, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.image_processor = AutoImageProcessor.from_pretrained(checkpoint)
        model = Qwen2VLForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32)
        self.model = model.to(device).eval()
        self.image_token_id = self.model.config.image_token_id

    def run(self, prompt: str, images: list[Image.Image], max_tokens: int) -> tuple[list[int], Greedy]:
        """(prompt ids with the placeholders expanded, greedy output tokens and their margins)."""
        pixels = self.image_processor(images=images, return_tensors="pt")
        counts = (pixels["image_grid_thw"].prod(-1) // MERGE**2).tolist()
        pieces = prompt.split("<|image_pad|>")
        text = pieces[0] + "".join("<|image_pad|>" * n + piece for n, piece in zip(counts, pieces[1:]))
        ids = self.tokenizer(text, return_tensors="pt")["input_ids"]
        inputs = dict(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            mm_token_type_ids=(ids == self.image_token_id).int(),
            **pixels,
        )
        return ids[0].tolist(), hf_greedy(self.model, inputs, max_tokens)

    def greedy(self, prompt: str, images: list[Image.Image], max_tokens: int) -> tuple[list[int], list[int]]:
        """(prompt ids with the placeholders expanded, greedy output tokens)."""
        ids, out = self.run(prompt, images, max_tokens)
        return ids, out.tokens
