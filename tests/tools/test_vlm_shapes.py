"""tools/vlm_shapes.py: image-model checkpoint directories with a real model's shape and no
weights. At the real shapes the model is the published one (its parameter count, the same
as transformers' model of that config) and the processor gives the model's image token
counts; a tiny shape runs offline on dummy weights, and only with them."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText, AutoProcessor

from minivllm import LLM, SamplingParams
from minivllm.attention.torch_backend import TorchAttentionBackend
from minivllm.config.store import build_config
from minivllm.models.registry import ModelRegistry
from tests.models.qwen2_vl_checkpoint import ONE_IMAGE, random_image
from tools.vlm_shapes import SHAPES, build_shape

# shape -> parameter count published for the checkpoint (llava-hf/llava-1.5-7b-hf, Qwen/Qwen2-VL-2B-Instruct)
PUBLISHED = {"llava-1.5-7b": 7_063_427_072, "qwen2-vl-2b": 2_208_985_600}


def _image_tokens(checkpoint, kind: str, image) -> int:
    """Placeholders transformers' processor makes of one image."""
    if kind == "llava":
        processor = AutoProcessor.from_pretrained(checkpoint)
        ids = processor(text=["<image>"], images=[image], return_tensors="pt")["input_ids"][0]
        return int((ids == processor.tokenizer.convert_tokens_to_ids("<image>")).sum())
    grid = AutoImageProcessor.from_pretrained(checkpoint)(images=[image], return_tensors="pt")["image_grid_thw"]
    return int(grid.prod()) // 4  # merged 2x2


@pytest.mark.parametrize("name, image_tokens", [("llava-1.5-7b", 576), ("qwen2-vl-2b", 256)])
def test_real_shapes_are_the_published_models(tmp_path, tokenizer_dir, name, image_tokens):
    checkpoint = build_shape(name, tmp_path / name, tokenizer_dir)
    cfg = build_config([f"model.path={checkpoint}", "load.format=dummy", "device=cpu"])
    with torch.device("meta"):  # shapes only
        ours = ModelRegistry.resolve(cfg.architecture)(cfg.hf_config, TorchAttentionBackend())
        theirs = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(checkpoint))
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters()) == PUBLISHED[name]
    size = SHAPES[name].image_size
    assert _image_tokens(checkpoint, SHAPES[name].kind, random_image(0, size, size)) == image_tokens


def test_a_tiny_shape_runs_on_dummy_weights_and_only_on_them(tmp_path, tokenizer_dir):
    checkpoint = build_shape("tiny-qwen2-vl", tmp_path / "tiny-qwen2-vl", tokenizer_dir)
    assert not [p.name for p in checkpoint.iterdir() if p.suffix in (".safetensors", ".bin", ".pt")]
    with pytest.raises(ValueError, match="no weight files .* run on random weights with load.format=dummy"):
        LLM(str(checkpoint), max_model_len=128, num_gpu_blocks_override=16)
    llm = LLM(str(checkpoint), load_format="dummy", max_model_len=128, num_gpu_blocks_override=16)
    image = random_image(1, 56, 84)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    out = llm.generate({"prompt": ONE_IMAGE, "multi_modal_data": {"image": image}}, params)[0]
    llm.shutdown()
    image_id = llm.cfg.hf_config.image_token_id
    assert out.prompt_token_ids.count(image_id) == _image_tokens(checkpoint, "qwen2_vl", image) == 6  # 4x6 patches
    vocab = llm.cfg.hf_text_config.vocab_size
    assert (
        vocab == 151936 and len(out.outputs[0].token_ids) == 4 and all(0 <= t < vocab for t in out.outputs[0].token_ids)
    )
