"""LLaVA at tp=2: the language model sharded over two worker processes, the vision tower
and projector replicated on both; greedy tokens equal transformers'."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from tests.multimodal.llava_checkpoint import HFLlava, random_image

pytestmark = pytest.mark.slow  # two worker processes

PROMPT = "USER: <image>\nWhat is in the picture? ASSISTANT:"


def test_llava_tp2_matches_transformers(llava_dir):
    images = [random_image(30), random_image(31)]
    llm = LLM(str(llava_dir), max_model_len=256, num_gpu_blocks_override=64, tensor_parallel_size=2)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": im}} for im in images], params)
    hf = HFLlava(llava_dir)
    for out, image in zip(outs, images):
        assert list(out.outputs[0].token_ids) == hf.greedy(PROMPT, [image], 6)[1]
