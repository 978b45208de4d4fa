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

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2VLConfig, Qwen2VLForConditionalGeneration

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


def build_llava(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Saved with transformers: weights, config, tokenizer with ``<image>``, CLIP image processor."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tok = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": [LLAVA_IMAGE_TOKEN]})
    tok.chat_template = LLAVA_CHAT_TEMPLATE
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        image_size=LLAVA_IMAGE_SIZE,
        patch_size=LLAVA_PATCH,
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
        image_token_index=tok.convert_tokens_to_ids(LLAVA_IMAGE_TOKEN),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        image_seq_length=LLAVA_NUM_IMAGE_TOKENS,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    with torch.no_grad():  # wider weights than the default init, so different images give different tokens
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    model.save_pretrained(out)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": LLAVA_IMAGE_SIZE}, crop_size={"height": LLAVA_IMAGE_SIZE, "width": LLAVA_IMAGE_SIZE}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=LLAVA_PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=LLAVA_CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    tok.save_pretrained(out)
    return out


# ---- Qwen2-VL -------------------------------------------------------------------------
QWEN2_VL_IMAGE_TOKEN, QWEN2_VL_VIDEO_TOKEN, QWEN2_VL_VISION_START, QWEN2_VL_VISION_END = 5, 6, 7, 8
QWEN2_VL_MERGE = 2
QWEN2_VL_SPECIAL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN2_VL_VISION = "<|vision_start|><|image_pad|><|vision_end|>"
QWEN2_VL_CHAT_TEMPLATE = _chat_template(QWEN2_VL_VISION)
QWEN2_VL_MIN_PIXELS, QWEN2_VL_MAX_PIXELS = 56 * 56, 112 * 112  # images of 2x2 to 4x4 merged tokens


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
    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, spatial_merge_size=QWEN2_VL_MERGE)
    special = dict(
        image_token_id=QWEN2_VL_IMAGE_TOKEN,
        video_token_id=QWEN2_VL_VIDEO_TOKEN,
        vision_start_token_id=QWEN2_VL_VISION_START,
        vision_end_token_id=QWEN2_VL_VISION_END,
    )
    config = Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie, **{**special, **ids})
    config.architectures = ["Qwen2VLForConditionalGeneration"]
    return config


def tiny_qwen2_vl_model(config: Qwen2VLConfig, seed: int = 0) -> Qwen2VLForConditionalGeneration:
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


def build_qwen2_vl(out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Saved with transformers: weights and config, the tokenizer with Qwen2-VL's vision
    tokens and a chat template, and the (PIL) image processor's config."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    out.mkdir(parents=True, exist_ok=True)
    tok = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    tok.add_special_tokens({"additional_special_tokens": QWEN2_VL_SPECIAL_TOKENS})
    tok.chat_template = QWEN2_VL_CHAT_TEMPLATE
    start, end, image, video = tok.convert_tokens_to_ids(QWEN2_VL_SPECIAL_TOKENS)
    config = tiny_qwen2_vl_config(
        vocab_size=len(tok),
        tie=True,
        image_token_id=image,
        video_token_id=video,
        vision_start_token_id=start,
        vision_end_token_id=end,
    )
    tiny_qwen2_vl_model(config, seed).save_pretrained(out)
    Qwen2VLImageProcessorPil(min_pixels=QWEN2_VL_MIN_PIXELS, max_pixels=QWEN2_VL_MAX_PIXELS).save_pretrained(out)
    tok.save_pretrained(out)
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
