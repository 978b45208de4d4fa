"""Qwen2-VL at tp=2: the language model (with M-RoPE) sharded over two worker processes, the
vision tower replicated on both; greedy tokens equal transformers' for images of different sizes."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from tests.models.qwen2_vl_checkpoint import VISION, HFQwen2VL, build_qwen2_vl, random_image

pytestmark = pytest.mark.slow  # two worker processes

PROMPT = f"user: {VISION}what is this?\nassistant:"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer_dir):
    return build_qwen2_vl(tmp_path_factory.mktemp("qwen2_vl_tp"), tokenizer_dir)


def test_qwen2_vl_tp2_matches_transformers(checkpoint):
    images = [random_image(0, 56, 84), random_image(1, 112, 84)]
    llm = LLM(str(checkpoint), max_model_len=128, num_gpu_blocks_override=64, tensor_parallel_size=2)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": im}} for im in images], params)
    hf = HFQwen2VL(checkpoint)
    expected = [hf.greedy(PROMPT, [image], 6) for image in images]
    assert expected[0][1] != expected[1][1], "the images should steer the model apart"
    for out, (prompt_ids, tokens) in zip(outs, expected):
        assert (out.prompt_token_ids, list(out.outputs[0].token_ids)) == (prompt_ids, tokens)
