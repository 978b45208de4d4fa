"""LLaVA-1.5 offline: greedy tokens equal transformers' ``generate`` on the same checkpoint
and images; chunked prefill through an image; prefix caching keyed by the image."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from tests.multimodal.llava_checkpoint import NUM_IMAGE_TOKENS, PROMPT, HFLlava, random_image

MAX_TOKENS = 6
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def hf(llava_dir):
    return HFLlava(llava_dir)


@pytest.fixture(scope="module")
def llm(llava_dir):
    return LLM(str(llava_dir), max_model_len=256, block_size=16, enable_prefix_caching=True, num_gpu_blocks_override=64)


def _runner(llm: LLM):
    return llm.llm_engine.core.executor.worker.model_runner


def _hits(llm: LLM) -> int:
    """Prompt tokens found in the prefix cache so far."""
    return llm.llm_engine.core.scheduler.kv.prefix_cache_stats.hits


def test_one_image_matches_transformers(llm, hf):
    images = [random_image(0), random_image(1)]
    outs = llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": im}} for im in images], GREEDY)
    expected = [hf.greedy(PROMPT, [im], MAX_TOKENS) for im in images]
    for out, (ids, tokens) in zip(outs, expected):
        assert out.prompt_token_ids == ids  # placeholders expanded as the HF processor does
        assert list(out.outputs[0].token_ids) == tokens
    assert expected[0][1] != expected[1][1], "the two images should steer the model apart"


def test_prompt_token_ids_with_an_image(llm, hf):
    image = random_image(2)
    ids = llm.get_tokenizer().encode(PROMPT)  # one <image> token, expanded by the engine
    out = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": [image]}}, GREEDY)[0]
    hf_ids, tokens = hf.greedy(PROMPT, [image], MAX_TOKENS)
    assert out.prompt_token_ids == hf_ids
    assert list(out.outputs[0].token_ids) == tokens


def test_prefix_cache_never_shares_kv_across_images(llm, hf):
    """Same text, different images: the blocks holding the placeholders differ in hash,
    so the second prompt reuses nothing; the same image again reuses its blocks."""
    prompt = "USER: " + "describe it in detail please " * 3 + "<image>\nand then say more ASSISTANT:"
    first, second = random_image(3), random_image(4)
    llm.generate({"prompt": prompt, "multi_modal_data": {"image": first}}, GREEDY)
    before = _hits(llm)
    out = llm.generate({"prompt": prompt, "multi_modal_data": {"image": second}}, GREEDY)[0]
    image_offset = out.prompt_token_ids.index(_image_id(llm))
    text_blocks = image_offset // 16  # blocks wholly before the image may be shared
    assert text_blocks >= 1
    assert _hits(llm) - before == text_blocks * 16
    assert list(out.outputs[0].token_ids) == hf.greedy(prompt, [second], MAX_TOKENS)[1]
    before = _hits(llm)
    again = llm.generate({"prompt": prompt, "multi_modal_data": {"image": second}}, GREEDY)[0]
    assert _hits(llm) - before == (len(again.prompt_token_ids) - 1) // 16 * 16
    assert again.outputs[0].token_ids == out.outputs[0].token_ids


def test_repeated_image_is_processed_once(llm):
    processor = llm.llm_engine.processor.mm
    image = random_image(5)
    start = processor.num_processed
    llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": image}}] * 2, GREEDY)
    assert processor.num_processed - start == 1


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_chunked_prefill_through_an_image(llava_dir, hf, async_scheduling):
    """A 5-token budget splits the 16 placeholders over several steps; the encoder
    runs once per image and its output serves every chunk. The encoder cache holds one
    image, so the second request's chunks stop before its image until the first is freed.
    Async scheduling (CUDA's default) schedules each step before the last one's tokens are back."""
    assert NUM_IMAGE_TOKENS > 5
    llm = LLM(
        str(llava_dir),
        async_scheduling=async_scheduling,
        max_model_len=256,
        max_num_batched_tokens=5,
        num_gpu_blocks_override=64,
        enable_prefix_caching=False,
        overrides=[
            f"scheduler.max_num_encoder_input_tokens={NUM_IMAGE_TOKENS}",
            f"scheduler.encoder_cache_size={NUM_IMAGE_TOKENS}",
        ],
    )
    images = [random_image(6), random_image(7)]
    outs = llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": im}} for im in images], GREEDY)
    for out, image in zip(outs, images):
        assert list(out.outputs[0].token_ids) == hf.greedy(PROMPT, [image], MAX_TOKENS)[1]
    assert llm.cfg.async_scheduling == async_scheduling
    mm = _runner(llm).mm
    assert mm.num_encoded == 2
    assert not mm.encoder_cache  # every output freed once its placeholders were computed
    assert not mm.features  # and no request left for the runner to look at


def _image_id(llm: LLM) -> int:
    return llm.llm_engine.processor.mm.image_token_id


def test_preempted_requests_encode_their_image_again(llava_dir, hf):
    """Seven 8-token blocks for three 46-token requests: running requests are preempted
    (their encoder outputs freed) and recomputed, images included; tokens stay exact."""
    llm = LLM(
        str(llava_dir),
        max_model_len=128,
        block_size=8,
        num_gpu_blocks_override=7,
        max_num_batched_tokens=8,
        enable_prefix_caching=False,
        overrides=[f"scheduler.max_num_encoder_input_tokens={NUM_IMAGE_TOKENS}", "scheduler.encoder_cache_size=32"],
    )
    images = [random_image(50 + i) for i in range(3)]
    outs = llm.generate([{"prompt": PROMPT, "multi_modal_data": {"image": im}} for im in images], GREEDY)
    scheduler, mm = llm.llm_engine.core.scheduler, _runner(llm).mm
    assert scheduler.num_preemptions > 0
    assert mm.num_encoded > len(images)  # a preempted request's image ran again
    for out, image in zip(outs, images):
        assert list(out.outputs[0].token_ids) == hf.greedy(PROMPT, [image], MAX_TOKENS)[1]
    assert not scheduler.encoder.cached and scheduler.encoder.num_free == 32 and not mm.encoder_cache


def test_requests_with_the_same_image_encode_it_once(llm, hf):
    image = random_image(8)
    prompts = [PROMPT, "USER: <image>\nDescribe the colours. ASSISTANT:"]
    mm = _runner(llm).mm
    before = mm.num_encoded
    outs = llm.generate([{"prompt": p, "multi_modal_data": {"image": image}} for p in prompts], GREEDY)
    assert mm.num_encoded - before == 1  # one encoder output, referenced by both requests
    for out, prompt in zip(outs, prompts):
        assert list(out.outputs[0].token_ids) == hf.greedy(prompt, [image], MAX_TOKENS)[1]
    assert not mm.encoder_cache
