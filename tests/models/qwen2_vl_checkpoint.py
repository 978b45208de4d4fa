"""A tiny random Qwen2-VL: transformers config and model, and helpers shared by its tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
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


SPECIAL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
VISION = "<|vision_start|><|image_pad|><|vision_end|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}" + VISION + "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
MIN_PIXELS, MAX_PIXELS = 56 * 56, 112 * 112  # images of 2x2 to 4x4 merged tokens (28-pixel blocks)


def build_qwen2_vl(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A saved checkpoint: weights and config (transformers' layout), the tokenizer with
    Qwen2-VL's vision tokens and a chat template, and the (PIL) image processor's config."""
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    out.mkdir(parents=True, exist_ok=True)
    tok = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    tok.chat_template = CHAT_TEMPLATE
    start, end, image, video = tok.convert_tokens_to_ids(SPECIAL_TOKENS)
    config = tiny_qwen2_vl_config(
        vocab_size=len(tok),
        tie=True,
        image_token_id=image,
        video_token_id=video,
        vision_start_token_id=start,
        vision_end_token_id=end,
    )
    tiny_hf_model(config, seed).save_pretrained(out)
    Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def random_image(seed: int, height: int, width: int) -> Image.Image:
    return Image.fromarray(np.random.RandomState(seed).randint(0, 255, (height, width, 3), dtype=np.uint8))


class HFQwen2VL:
    """The oracle: transformers' image processor and ``generate`` on the saved checkpoint. Each
    ``<|image_pad|>`` of the text becomes ``t * h * w / 4`` of them, as transformers' processor
    expands it (which itself needs torchvision to be built)."""

    def __init__(self, checkpoint: Path) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.image_processor = AutoImageProcessor.from_pretrained(checkpoint)
        self.model = Qwen2VLForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
        self.image_token_id = self.model.config.image_token_id

    def greedy(self, prompt: str, images: list[Image.Image], max_tokens: int) -> tuple[list[int], list[int]]:
        """(prompt ids with the placeholders expanded, greedy output tokens)."""
        pixels = self.image_processor(images=images, return_tensors="pt")
        counts = (pixels["image_grid_thw"].prod(-1) // MERGE**2).tolist()
        pieces = prompt.split("<|image_pad|>")
        text = pieces[0] + "".join("<|image_pad|>" * n + piece for n, piece in zip(counts, pieces[1:]))
        ids = self.tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                mm_token_type_ids=(ids == self.image_token_id).int(),
                **pixels,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        return ids[0].tolist(), out[0, ids.shape[1] :].tolist()
