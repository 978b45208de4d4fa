"""Tiny random vision-language checkpoints, built on the spot with transformers (no hub):
LLaVA-1.5 (CLIP tower, projector, Llama) and Qwen2-VL (its ViT with 2-D RoPE, Qwen2 with
M-RoPE), each with a byte-level BPE tokenizer trained on local text, its image tokens, a
chat template and the image processor's config. The tests load them next to transformers'
own model; ``task=bench bench=multimodal`` times the engine on them.

    python -m tools.tiny_vlm llava /tmp/tiny-llava
    python -m tools.tiny_vlm qwen2_vl /tmp/tiny-qwen2-vl
"""

from __future__ import annotations

import argparse
import sysconfig
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2VLConfig

if TYPE_CHECKING:  # the modeling code loads only where weights are made (tools/vlm_shapes.py makes none)
    from transformers import Qwen2VLForConditionalGeneration

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}


# ---- the tokenizer --------------------------------------------------------------------
def local_corpus(max_chars: int = 400_000) -> list[str]:
    """Text that exists on every machine with Python: the standard library's source."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        texts.append(text)
        total += len(text)
        if total > max_chars:
            break
    return texts


def train_tokenizer(out_dir: Path, vocab_size: int = 512) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[SPECIAL["pad_token"], SPECIAL["bos_token"], SPECIAL["eos_token"], SPECIAL["unk_token"]],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(local_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL)
    fast.save_pretrained(out_dir)
    return fast


def _chat_template(image_text: str) -> str:
    return (
        "{% for m in messages %}{{ m['role'] }}: "
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}" + image_text + "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    )


# ---- LLaVA-1.5 ------------------------------------------------------------------------
LLAVA_IMAGE_TOKEN = "<image>"
LLAVA_IMAGE_SIZE, LLAVA_PATCH = 16, 4
LLAVA_NUM_IMAGE_TOKENS = (LLAVA_IMAGE_SIZE // LLAVA_PATCH) ** 2  # the CLS row is dropped ("default" strategy)
LLAVA_CHAT_TEMPLATE = _chat_template("<image>\n")
LLAVA_PROMPT = "USER: <image>\nWhat is in the picture? ASSISTANT:"  # one image, in LLaVA-1.5's prompt format


TINY_LLAVA_VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    image_size=LLAVA_IMAGE_SIZE,
    patch_size=LLAVA_PATCH,
    projection_dim=32,
)
TINY_LLAVA_TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def llava_tokenizer(tokenizer_dir: Path) -> PreTrainedTokenizerFast:
    """The trained tokenizer with ``<image>`` added and the chat template set."""
    tok = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": [LLAVA_IMAGE_TOKEN]})
    tok.chat_template = LLAVA_CHAT_TEMPLATE
    return tok


def llava_config(tok: PreTrainedTokenizerFast, vision: dict, text: dict):
    """A LLaVA-1.5 config (CLIP tower, ``vision`` keys; Llama, ``text`` keys; vocab_size defaults
    to the tokenizer's) whose image token is the tokenizer's ``<image>``."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    image_size, patch = vision["image_size"], vision["patch_size"]
    text = dict(dict(vocab_size=len(tok), bos_token_id=1, eos_token_id=2, pad_token_id=0), **text)
    return LlavaConfig(
        vision_config=CLIPVisionConfig(**vision),
        text_config=LlamaConfig(**text),
        image_token_index=tok.convert_tokens_to_ids(LLAVA_IMAGE_TOKEN),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        image_seq_length=(image_size // patch) ** 2,  # the CLS row is dropped ("default" strategy)
    )


def save_llava_processor(out: Path, tok: PreTrainedTokenizerFast, image_size: int, patch: int) -> None:
    """The CLIP image processor (resize and crop to ``image_size``), the processor and the tokenizer."""
    from transformers import CLIPImageProcessor, LlavaProcessor

    image_processor = CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=patch,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=LLAVA_CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    tok.save_pretrained(out)


def build_llava(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Saved with transformers: weights, config, tokenizer with ``<image>``, CLIP image processor."""
    from transformers import LlavaForConditionalGeneration

    out.mkdir(parents=True, exist_ok=True)
    tok = llava_tokenizer(tokenizer_dir)
    config = llava_config(tok, TINY_LLAVA_VISION, TINY_LLAVA_TEXT)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    with torch.no_grad():  # wider weights than the default init, so different images give different tokens
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    model.save_pretrained(out)
    save_llava_processor(out, tok, LLAVA_IMAGE_SIZE, LLAVA_PATCH)
    return out


# ---- Qwen2-VL -------------------------------------------------------------------------
QWEN2_VL_IMAGE_TOKEN, QWEN2_VL_VIDEO_TOKEN, QWEN2_VL_VISION_START, QWEN2_VL_VISION_END = 5, 6, 7, 8
QWEN2_VL_MERGE = 2
QWEN2_VL_SPECIAL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN2_VL_VISION = "<|vision_start|><|image_pad|><|vision_end|>"
QWEN2_VL_CHAT_TEMPLATE = _chat_template(QWEN2_VL_VISION)
QWEN2_VL_MIN_PIXELS, QWEN2_VL_MAX_PIXELS = 56 * 56, 112 * 112  # images of 2x2 to 4x4 merged tokens


TINY_QWEN2_VL_TEXT = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
)
TINY_QWEN2_VL_VISION = dict(
    depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, spatial_merge_size=QWEN2_VL_MERGE
)


def qwen2_vl_config(text: dict, vision: dict, tie: bool, **ids: int) -> Qwen2VLConfig:
    """A Qwen2-VL config of the given text and vision keys; ``ids`` overrides the special token ids."""
    text = dict(dict(bos_token_id=1, eos_token_id=2), **text)
    special = dict(
        image_token_id=QWEN2_VL_IMAGE_TOKEN,
        video_token_id=QWEN2_VL_VIDEO_TOKEN,
        vision_start_token_id=QWEN2_VL_VISION_START,
        vision_end_token_id=QWEN2_VL_VISION_END,
    )
    config = Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie, **{**special, **ids})
    config.architectures = ["Qwen2VLForConditionalGeneration"]
    return config


def tiny_qwen2_vl_config(vocab_size: int = 600, tie: bool = False, **ids: int) -> Qwen2VLConfig:
    """Two text layers with GQA and an mrope_section over a head of 16 (8 frequencies); a
    two-block vision tower of width 32. ``ids`` overrides the special token ids."""
    return qwen2_vl_config(dict(TINY_QWEN2_VL_TEXT, vocab_size=vocab_size), TINY_QWEN2_VL_VISION, tie, **ids)


def tiny_qwen2_vl_model(config: Qwen2VLConfig, seed: int = 0) -> Qwen2VLForConditionalGeneration:
    """Random weights, spread wide enough that the vision tower's output matters."""
    from transformers import Qwen2VLForConditionalGeneration

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


def qwen2_vl_tokenizer(tokenizer_dir: Path) -> tuple[PreTrainedTokenizerFast, dict[str, int]]:
    """The trained tokenizer with Qwen2-VL's vision tokens and a chat template; and their ids
    as the config's keyword arguments."""
    tok = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": QWEN2_VL_SPECIAL_TOKENS})
    tok.chat_template = QWEN2_VL_CHAT_TEMPLATE
    start, end, image, video = tok.convert_tokens_to_ids(QWEN2_VL_SPECIAL_TOKENS)
    ids = dict(image_token_id=image, video_token_id=video, vision_start_token_id=start, vision_end_token_id=end)
    return tok, ids


def save_qwen2_vl_processor(out: Path, tok: PreTrainedTokenizerFast, min_pixels: int, max_pixels: int) -> None:
    """The (PIL) image processor's config, resizing into [min_pixels, max_pixels]; and the tokenizer."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels).save_pretrained(out)
    tok.save_pretrained(out)


def build_qwen2_vl(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Saved with transformers: weights and config, the tokenizer with Qwen2-VL's vision
    tokens and a chat template, and the (PIL) image processor's config."""
    out.mkdir(parents=True, exist_ok=True)
    tok, ids = qwen2_vl_tokenizer(tokenizer_dir)
    config = tiny_qwen2_vl_config(vocab_size=len(tok), tie=True, **ids)
    tiny_qwen2_vl_model(config, seed).save_pretrained(out)
    save_qwen2_vl_processor(out, tok, QWEN2_VL_MIN_PIXELS, QWEN2_VL_MAX_PIXELS)
    return out


BUILDERS = {"llava": build_llava, "qwen2_vl": build_qwen2_vl}


def build(kind: str, out: Path, seed: int = 0) -> Path:
    """A tiny ``kind`` checkpoint (llava or qwen2_vl) in ``out``, its tokenizer trained first."""
    if kind not in BUILDERS:
        raise ValueError(f"kind={kind!r}: one of {sorted(BUILDERS)}")
    with tempfile.TemporaryDirectory(prefix="tiny-vlm-tokenizer-") as tok_dir:
        train_tokenizer(Path(tok_dir))
        return BUILDERS[kind](Path(out), Path(tok_dir), seed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=sorted(BUILDERS))
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build(args.kind, args.out, args.seed))


if __name__ == "__main__":
    main()
