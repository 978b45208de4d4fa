"""A tiny random LLaVA-1.5 checkpoint: CLIP vision tower, projector, Llama text model,
a tokenizer with the ``<image>`` token and a chat template, and the CLIP image
processor's config, all saved with transformers (the oracle loads the same files)."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

IMAGE_TOKEN = "<image>"
IMAGE_SIZE, PATCH = 16, 4
NUM_IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # the CLS row is dropped ("default" strategy)
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image>\n{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def build_llava(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tok = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tok.chat_template = CHAT_TEMPLATE
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
        projection_dim=32,
    )
    text = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tok),
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        image_seq_length=NUM_IMAGE_TOKENS,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    with torch.no_grad():  # wider weights than the default init, so different images give different tokens
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    model.save_pretrained(out)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def random_image(seed: int, size: int = 30) -> Image.Image:
    return Image.fromarray(np.random.RandomState(seed).randint(0, 255, (size, size, 3), dtype=np.uint8))


def data_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class HFLlava:
    """transformers' own processor and ``generate`` on the checkpoint: the oracle."""

    def __init__(self, checkpoint: Path) -> None:
        from transformers import AutoProcessor

        self.processor = AutoProcessor.from_pretrained(checkpoint)
        self.model = LlavaForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()

    def greedy(self, prompt: str, images: list[Image.Image], max_tokens: int) -> tuple[list[int], list[int]]:
        """(prompt ids after the processor's expansion, greedy output tokens)."""
        inputs = self.processor(text=[prompt], images=images or None, return_tensors="pt")
        with torch.no_grad():
            out = self.model.generate(
                **inputs, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, pad_token_id=0
            )
        n = inputs["input_ids"].shape[1]
        return inputs["input_ids"][0].tolist(), out[0, n:].tolist()
