"""Qwen2-VL offline, end to end: greedy tokens equal transformers' ``generate`` on the same
checkpoint and images, for one image, two images of different sizes in one prompt, the
same prompts again from the prefix cache, a chat message with an image_url part, and chunked prefill cutting through the image
placeholders (M-RoPE positions and image rows then arrive in pieces)."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from tests.engine.test_multi_step import spy_on_steps
from tests.models.qwen2_vl_checkpoint import HFQwen2VL, build_qwen2_vl, parity_prompts
from tests.multimodal.llava_checkpoint import data_url
from tests.multimodal.vlm_greedy import engine_greedy

MAX_TOKENS = 6
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
ENCODER = ["scheduler.max_num_encoder_input_tokens=64", "scheduler.encoder_cache_size=64"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer_dir):
    return build_qwen2_vl(tmp_path_factory.mktemp("qwen2_vl"), tokenizer_dir)


@pytest.fixture(scope="module")
def hf(checkpoint):
    return HFQwen2VL(checkpoint)


def _generate(llm: LLM, prompts: list[tuple[str, list]]) -> list[tuple[list[int], list[int]]]:
    return engine_greedy(llm, prompts, MAX_TOKENS)


@pytest.mark.slow
def test_greedy_tokens_match_transformers(checkpoint, hf):
    prompts = parity_prompts()
    small = prompts[0][1][0]
    expected = [hf.greedy(p, ims, MAX_TOKENS) for p, ims in prompts]
    assert len({tuple(tokens) for _, tokens in expected}) > 1, "the images should steer the model apart"
    whole = LLM(
        str(checkpoint),
        max_model_len=128,
        block_size=8,
        limit_mm_per_prompt={"image": 2},
        enable_prefix_caching=True,
        seed=0,
    )
    assert _generate(whole, prompts) == expected
    hits = whole.llm_engine.core.scheduler.kv.prefix_cache_stats.hits
    assert _generate(whole, prompts) == expected  # again, from cached blocks: their M-RoPE positions still hold
    assert whole.llm_engine.core.scheduler.kv.prefix_cache_stats.hits > hits
    image_part = {"type": "image_url", "image_url": {"url": data_url(small)}}
    chat = whole.chat([{"role": "user", "content": [image_part, {"type": "text", "text": "what is it?"}]}], GREEDY)
    rendered = hf.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is it?"}]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert (chat[0].prompt_token_ids, list(chat[0].outputs[0].token_ids)) == hf.greedy(rendered, [small], MAX_TOKENS)
    whole.shutdown()
    # 8-token steps: every image's placeholders (and M-RoPE positions) are split across steps;
    # under async scheduling (CUDA's default), which schedules a step before the last one's tokens are back
    chunked = LLM(
        str(checkpoint),
        async_scheduling=True,
        max_model_len=128,
        block_size=8,
        limit_mm_per_prompt={"image": 2},
        max_num_batched_tokens=8,
        enable_chunked_prefill=True,
        overrides=ENCODER,
        seed=0,
    )
    assert _generate(chunked, prompts) == expected
    assert chunked.cfg.async_scheduling
    chunked.shutdown()


def test_speculative_decoding_is_refused_at_start(checkpoint):
    """Refused at config time for every model that takes images (proposers build (T,) positions)."""
    ngram = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    with pytest.raises(
        ValueError, match="speculative.method=ngram: not supported with Qwen2VLForConditionalGeneration"
    ):
        LLM(str(checkpoint), max_model_len=128, speculative_config=ngram)


def test_multi_step_decoding_moves_m_rope_positions_on_the_device(checkpoint, hf):
    """``scheduler.num_scheduler_steps``: the decode steps after a prompt with images advance
    their (3, T) M-RoPE positions on the device, and the tokens stay transformers'."""
    prompts = parity_prompts()[:2]
    expected = [hf.greedy(p, ims, MAX_TOKENS) for p, ims in prompts]
    llm = LLM(
        str(checkpoint),
        max_model_len=128,
        block_size=8,
        limit_mm_per_prompt={"image": 2},
        num_scheduler_steps=4,
        seed=0,
    )
    try:
        seen = spy_on_steps(llm.llm_engine)
        assert _generate(llm, prompts) == expected
    finally:
        llm.shutdown()
    assert 4 in seen
