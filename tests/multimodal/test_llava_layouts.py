"""LLaVA weights load from every transformers layout: the saved one
(``language_model.model.*``), the in-memory one (``model.language_model.*``, ``lm_head.*``),
and old checkpoints' ``vision_tower.vision_model.*``; all three generate the same tokens."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

from minivllm import LLM, SamplingParams
from minivllm.models.llava import checkpoint_name
from tests.multimodal.llava_checkpoint import random_image

PROMPT = {"prompt": "USER: <image>\nWhat is it? ASSISTANT:", "multi_modal_data": {"image": random_image(40)}}
PARAMS = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
KWARGS = dict(max_model_len=128, num_gpu_blocks_override=16)


@pytest.fixture(scope="module")
def expected(llava_dir):
    return LLM(str(llava_dir), **KWARGS).generate(PROMPT, PARAMS)[0].outputs[0].token_ids


def _in_memory(name: str) -> str:
    for old, new in (("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head.")):
        if name.startswith(old):
            return new + name[len(old) :]
    return "model." + name


def _old_vision(name: str) -> str:
    return name.replace("vision_tower.", "vision_tower.vision_model.", 1)


@pytest.mark.parametrize("rename", [_in_memory, _old_vision], ids=["in-memory", "vision_model"])
def test_layouts_load_to_the_same_model(llava_dir, tmp_path, rename, expected):
    state = load_file(llava_dir / "model.safetensors")
    assert all(checkpoint_name(rename(k)) == k for k in state)
    copy = tmp_path / "ckpt"
    shutil.copytree(llava_dir, copy)
    save_file({rename(k): v for k, v in state.items()}, copy / "model.safetensors", metadata={"format": "pt"})
    assert LLM(str(copy), **KWARGS).generate(PROMPT, PARAMS)[0].outputs[0].token_ids == expected
