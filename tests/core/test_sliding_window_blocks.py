"""KV blocks that fell out of every layer's sliding window go back to the pool."""

from __future__ import annotations

import torch

from minivllm import LLM, SamplingParams
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.sliding_window import num_blocks_out_of_window
from minivllm.kv_cache_spec import max_blocks_per_request
from tests.core.scheduler_helpers import make_request
from tests.model_configs import gemma2_config, mistral_config
from tests.models.test_parity import _load_hf, _reference_logprobs


def test_blocks_before_the_window_of_the_next_token_are_freed():
    """block_size 4, window 6: the token at position p reads keys p-5 .. p."""
    kv = KVCacheManager(num_blocks=8, block_size=4, sliding_window=6)
    request = make_request(list(range(10, 20)), max_tokens=8)  # 10 prompt tokens
    assert kv.allocate_slots(request, 10) == [0, 1, 2]
    request.num_computed_tokens = 10
    for token in range(8):  # decode: the new token sits at position 10, 11, ...
        request.output_token_ids.append(token)
        kv.allocate_slots(request, 1)
        first_needed_block = max(request.num_computed_tokens - 5, 0) // 4
        held = len(kv.block_ids(request.request_id)) - first_needed_block
        assert kv.num_free_blocks == 8 - held
        request.num_computed_tokens += 1
    # position 17 reads 12..17: blocks 0, 1 and 2 (positions 0-11) were freed, in that order
    assert kv.block_ids(request.request_id) == [0, 1, 2, 3, 4]  # stale ids keep positions aligned
    assert kv.pool.free_block_ids() == [5, 6, 7, 0, 1, 2]
    kv.free(request)
    assert kv.num_free_blocks == 8  # the out-of-window blocks are not freed twice


def test_without_a_window_every_block_stays():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    request = make_request(list(range(10, 30)), max_tokens=1)
    kv.allocate_slots(request, 20)
    request.num_computed_tokens = 20
    request.output_token_ids.append(5)
    kv.allocate_slots(request, 1)
    assert kv.num_free_blocks == 8 - 6


def test_a_prefix_hit_past_the_window_frees_the_hit_blocks_it_no_longer_needs():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_caching=True, sliding_window=6)
    prompt = list(range(10, 23))  # 13 tokens: 3 full blocks
    first = make_request(prompt, max_tokens=1)
    kv.allocate_slots(first, 13)
    first.num_computed_tokens = 13
    kv.free(first)
    second = make_request(prompt, max_tokens=1)
    cached = kv.get_computed_blocks(second)
    assert [b.block_id for b in cached] == [0, 1, 2]
    assert kv.allocate_slots(second, 1, cached) == [4]  # position 12 starts a new block
    # position 12 reads 7..12: hit block 0 (positions 0-3) is free again, still cached
    assert kv.num_free_blocks == 8 - 3 and kv.pool.free_block_ids()[-1] == 0
    assert [b.block_id for b in kv.get_computed_blocks(make_request(prompt))] == [0, 1, 2]


def test_blocks_per_request_for_the_logged_concurrency():
    assert max_blocks_per_request(4096, 16, None, 512) == 256
    assert max_blocks_per_request(4096, 16, 256, 512) == 49  # cdiv(255 + 512, 16) + 1
    assert num_blocks_out_of_window(13, 6, 4) == 2 and num_blocks_out_of_window(13, None, 4) == 0


PROMPT_LEN, MAX_TOKENS, BLOCK_SIZE, SMALL_CACHE = 8, 56, 4, 6


def _generate(ckpt, num_blocks: int) -> tuple[list[int], list[int], LLM]:
    llm = LLM(
        model=str(ckpt),
        dtype="float32",
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=num_blocks,
        max_model_len=128,
        max_num_batched_tokens=8,
    )
    prompt = torch.randint(4, 512, (PROMPT_LEN,), generator=torch.Generator().manual_seed(7)).tolist()
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm.llm_engine.add_request("long", {"prompt_token_ids": prompt}, params)
    kv = llm.llm_engine.core.scheduler.kv
    tokens = []
    while llm.llm_engine.has_unfinished_requests():
        for out in llm.llm_engine.step():
            tokens = out.outputs[0].token_ids
        # window 5: at most 2 blocks of 4 hold the window, plus the block being filled
        assert kv.num_free_blocks >= num_blocks - 3
    assert llm.llm_engine.core.scheduler.num_preemptions == 0
    return prompt, tokens, llm


def test_long_generation_fits_a_small_cache_by_freeing_out_of_window_blocks(make_checkpoint):
    """68 tokens in a cache of 6 blocks of 4 (24 tokens): it fits only because the
    5-token window of a Mistral checkpoint lets all but the last few blocks go."""
    ckpt = make_checkpoint("mistral-window5-mqa", mistral_config())
    assert PROMPT_LEN + MAX_TOKENS > SMALL_CACHE * BLOCK_SIZE
    prompt, small, llm = _generate(ckpt, SMALL_CACHE)
    spec = llm.llm_engine.core.kv_spec  # reported by the worker from the model it loaded
    per_request = spec.max_blocks_per_request(llm.cfg.max_model_len, llm.cfg.scheduler.max_num_batched_tokens)
    assert spec.sliding_window == 5 and per_request == 4  # cdiv(4 + 8, 4) + 1
    llm.shutdown()
    _, big, llm = _generate(ckpt, 64)
    llm.shutdown()
    assert len(small) == MAX_TOKENS and small == big
    reference = _reference_logprobs(_load_hf(ckpt), prompt, small)  # transformers, whole sequence at once
    assert reference.argmax(dim=-1).tolist() == small


def test_a_model_with_global_layers_frees_nothing(make_checkpoint):
    ckpt = make_checkpoint("gemma2-softcaps-window6-alternating", gemma2_config())
    llm = LLM(model=str(ckpt), dtype="float32", block_size=BLOCK_SIZE, num_gpu_blocks_override=32)
    spec, max_len = llm.llm_engine.core.kv_spec, llm.cfg.max_model_len
    per_request = spec.max_blocks_per_request(max_len, llm.cfg.scheduler.max_num_batched_tokens)
    assert spec.sliding_window is None and per_request == max_len // 4
    llm.shutdown()


def test_prefix_hits_on_blocks_freed_behind_the_window_stay_correct(make_checkpoint):
    """A's prefix blocks leave its window and are freed but stay cached; B and C then
    hit them (taking them back), and every output still equals transformers'."""
    ckpt = make_checkpoint("mistral-window5-mqa", mistral_config())
    gen = torch.Generator().manual_seed(3)
    prefix = torch.randint(4, 512, (20,), generator=gen).tolist()
    prompts = [prefix + torch.randint(4, 512, (3,), generator=gen).tolist() for _ in range(3)]
    llm = LLM(model=str(ckpt), dtype="float32", block_size=4, num_gpu_blocks_override=12, max_num_batched_tokens=8)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": prompts[0]}], params, use_tqdm=False)
    rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params, use_tqdm=False)
    kv = llm.llm_engine.core.scheduler.kv
    assert kv.prefix_cache_stats.hits == 2 * 20  # both later requests found the 5 full prefix blocks
    assert llm.llm_engine.core.scheduler.num_preemptions == 0
    llm.shutdown()
    hf_model = _load_hf(ckpt)
    for prompt, out in zip(prompts, first + rest):
        tokens = out.outputs[0].token_ids
        assert _reference_logprobs(hf_model, prompt, tokens).argmax(dim=-1).tolist() == tokens
