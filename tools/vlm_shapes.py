"""Vision-language checkpoint directories with a real model's shape and no weights: the
config, a tokenizer (trained on local text, with the model's image tokens) and the image
processor, so that ``load.format=dummy`` runs the model at that shape offline. The
throughput of such a run is the real model's (random weights change what it says, not
how long it takes); its vocabulary is the real size, the tokenizer's is not (random
token ids beyond the tokenizer decode to nothing).

    python -m tools.vlm_shapes llava-1.5-7b /tmp/llava-1.5-7b   # prints the directory
    python -m tools.vlm_shapes qwen2-vl-2b /tmp/qwen2-vl-2b --print image_size   # 448
    python -m tools.vlm_shapes tiny-llava /tmp/t --tokenizer /tmp/tok   # trains into /tmp/tok once

Shapes: ``llava-1.5-7b`` (CLIP ViT-L/14 at 336 px, 576 image tokens, Llama-2-7B),
``qwen2-vl-2b`` (its 32-block ViT, 448x448 images give 256 tokens; Qwen2-1.5B with
M-RoPE), and ``tiny-llava``, ``tiny-qwen2-vl`` (tools/tiny_vlm.py's shapes with the real
vocabularies: the same path on a CPU in seconds).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.tiny_vlm import (
    LLAVA_IMAGE_SIZE,
    QWEN2_VL_MAX_PIXELS,
    QWEN2_VL_MIN_PIXELS,
    TINY_LLAVA_TEXT,
    TINY_LLAVA_VISION,
    TINY_QWEN2_VL_TEXT,
    TINY_QWEN2_VL_VISION,
    llava_config,
    llava_tokenizer,
    qwen2_vl_config,
    qwen2_vl_tokenizer,
    save_llava_processor,
    save_qwen2_vl_processor,
    train_tokenizer,
)


@dataclass(frozen=True)
class VLMShape:
    kind: str
    """llava or qwen2_vl."""
    text: dict[str, Any]
    vision: dict[str, Any]
    image_size: int
    """The side of the square images the model takes natively (what the bench sends)."""
    dtype: str = "bfloat16"
    pixels: tuple[int, int] = (0, 0)
    """Qwen2-VL: the image processor's (min_pixels, max_pixels)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Top-level config keys (Qwen2-VL: tie_word_embeddings)."""


LLAMA2_7B = dict(
    vocab_size=32064,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
)
CLIP_VIT_L_14_336 = dict(
    hidden_size=1024,
    intermediate_size=4096,
    num_hidden_layers=24,
    num_attention_heads=16,
    image_size=336,
    patch_size=14,
    projection_dim=768,
    hidden_act="quick_gelu",
)
QWEN2_VL_2B_TEXT = dict(
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
)
QWEN2_VL_2B_VISION = dict(
    depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4, spatial_merge_size=2, patch_size=14
)

SHAPES = {
    "llava-1.5-7b": VLMShape("llava", LLAMA2_7B, CLIP_VIT_L_14_336, image_size=336, dtype="float16"),
    "qwen2-vl-2b": VLMShape(
        "qwen2_vl",
        QWEN2_VL_2B_TEXT,
        QWEN2_VL_2B_VISION,
        image_size=448,
        pixels=(56 * 56, 28 * 28 * 1280),
        extra={"tie_word_embeddings": True},
    ),
    "tiny-llava": VLMShape(
        "llava", dict(TINY_LLAVA_TEXT, vocab_size=32064), TINY_LLAVA_VISION, image_size=LLAVA_IMAGE_SIZE
    ),
    "tiny-qwen2-vl": VLMShape(
        "qwen2_vl",
        dict(TINY_QWEN2_VL_TEXT, vocab_size=151936),
        TINY_QWEN2_VL_VISION,
        image_size=56,
        pixels=(QWEN2_VL_MIN_PIXELS, QWEN2_VL_MAX_PIXELS),
        extra={"tie_word_embeddings": True},
    ),
}


ARCHITECTURES = {"llava": "LlavaForConditionalGeneration", "qwen2_vl": "Qwen2VLForConditionalGeneration"}


def _save_config(config: Any, out: Path, shape: VLMShape) -> None:
    config.architectures = [ARCHITECTURES[shape.kind]]
    config.dtype = shape.dtype
    config.save_pretrained(out)


def build_shape(name: str, out: Path, tokenizer_dir: Path | None = None) -> Path:
    """The directory ``out`` for shape ``name``: config.json, tokenizer and processor, no
    weights. ``tokenizer_dir``: an already trained tokenizer (else one is trained here)."""
    if name not in SHAPES:
        raise ValueError(f"shape {name!r}: one of {sorted(SHAPES)}")
    if tokenizer_dir is None:
        with tempfile.TemporaryDirectory(prefix="vlm-shape-tokenizer-") as tmp:
            train_tokenizer(Path(tmp))
            return build_shape(name, out, Path(tmp))
    shape = SHAPES[name]
    out.mkdir(parents=True, exist_ok=True)
    if shape.kind == "llava":
        tok = llava_tokenizer(tokenizer_dir)
        _save_config(llava_config(tok, shape.vision, shape.text), out, shape)
        save_llava_processor(out, tok, shape.vision["image_size"], shape.vision["patch_size"])
    else:
        tok, ids = qwen2_vl_tokenizer(tokenizer_dir)
        config = qwen2_vl_config(shape.text, shape.vision, shape.extra.get("tie_word_embeddings", False), **ids)
        _save_config(config, out, shape)
        save_qwen2_vl_processor(out, tok, *shape.pixels)
    (out / "shape.json").write_text(json.dumps({"shape": name, "image_size": shape.image_size}))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--print", choices=("dir", "image_size"), default="dir", help="what to print once built")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer directory to reuse (trained into it when empty)")
    args = parser.parse_args(argv)
    if args.tokenizer is not None and not (args.tokenizer / "tokenizer.json").is_file():
        args.tokenizer.mkdir(parents=True, exist_ok=True)
        train_tokenizer(args.tokenizer)
    out = build_shape(args.shape, args.out, args.tokenizer)
    print(out if args.print == "dir" else SHAPES[args.shape].image_size)


if __name__ == "__main__":
    main()
