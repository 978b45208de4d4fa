"""KV blocks that fell out of every layer's sliding window go back to the pool, end to end on
windowed checkpoints (the KV-cache manager's own window tests are in test_kv_cache_manager.py)."""

from __future__ import annotations

import torch

from minivllm import LLM, SamplingParams
from tests.model_configs import gemma2_config, mistral_config
from tests.models.test_parity import _load_hf, _reference_logprobs

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
