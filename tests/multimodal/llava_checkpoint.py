"""The tiny random LLaVA-1.5 checkpoint of the tests (built by ``tools/tiny_vlm.py``: CLIP
vision tower, projector, Llama text model, tokenizer with ``<image>``, CLIP image processor),
images for it, and transformers on the same files as the oracle."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import LlavaForConditionalGeneration

from tests.multimodal.vlm_greedy import Greedy, hf_greedy
from tools.tiny_vlm import (  # noqa: F401 (the builder lives with the tool; tests import it from here)
    LLAVA_CHAT_TEMPLATE,
    LLAVA_IMAGE_SIZE,
    LLAVA_IMAGE_TOKEN,
    LLAVA_NUM_IMAGE_TOKENS,
    LLAVA_PATCH,
    LLAVA_PROMPT,
    build_llava,
)

IMAGE_TOKEN = LLAVA_IMAGE_TOKEN
IMAGE_SIZE, PATCH = LLAVA_IMAGE_SIZE, LLAVA_PATCH
NUM_IMAGE_TOKENS = LLAVA_NUM_IMAGE_TOKENS
CHAT_TEMPLATE = LLAVA_CHAT_TEMPLATE
PROMPT = LLAVA_PROMPT


def random_image(seed: int, size: int = 30) -> Image.Image:
    return Image.fromarray(np.random.RandomState(seed).randint(0, 255, (size, size, 3), dtype=np.uint8))


def data_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class HFLlava:
    """transformers' own processor and ``generate`` on the checkpoint: the oracle (in fp32, on
    ``device``)."""

    def __init__(self, checkpoint: Path, device: str = "cpu") -> None:
        from transformers import AutoProcessor

        self.processor = AutoProcessor.from_pretrained(checkpoint)
        model = LlavaForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32)
        self.model = model.to(device).eval()

    def run(self, prompt: str, images: list[Image.Image], max_tokens: int) -> tuple[list[int], Greedy]:
        """(prompt ids after the processor's expansion, greedy output tokens and their margins)."""
        inputs = self.processor(text=[prompt], images=images or None, return_tensors="pt")
        return inputs["input_ids"][0].tolist(), hf_greedy(self.model, dict(inputs), max_tokens)

    def greedy(self, prompt: str, images: list[Image.Image], max_tokens: int) -> tuple[list[int], list[int]]:
        """(prompt ids after the processor's expansion, greedy output tokens)."""
        ids, out = self.run(prompt, images, max_tokens)
        return ids, out.tokens
