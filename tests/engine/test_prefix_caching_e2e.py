"""End to end on a tiny Llama: a cache that holds only a few requests, a token budget
smaller than the longest prompt, prefix caching and preemption, against a run with a
huge cache and no prefix caching. Greedy outputs must be identical."""

import random

import pytest
import torch

from minivllm import LLM, SamplingParams
from tests.model_configs import llama_config


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny matmuls: intra-op threads only add overhead (and spin on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_llama(make_checkpoint):
    config = llama_config(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)
    return make_checkpoint("llama-tiny-kvcache", config)


def workload(n: int, seed: int):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 512) for _ in range(rng.randrange(8, 40))] for _ in range(5)]
    prompts, params = [], []
    for _ in range(n):
        head = rng.choice(prefixes) if rng.random() < 0.8 else []
        ids = (head + [rng.randrange(3, 512) for _ in range(rng.randrange(1, 25))])[:60]
        ids = ids if len(ids) >= 5 else ids + [7] * (5 - len(ids))
        prompts.append({"prompt_token_ids": ids})
        params.append(SamplingParams(temperature=0, max_tokens=rng.randrange(2, 9), ignore_eos=True))
    return prompts, params


def generate_tracking_usage(llm: LLM, prompts, params, **kwargs):
    engine, usage = llm.llm_engine, []
    step = engine.step

    def tracked_step():
        outs = step()
        usage.append(engine.scheduler_stats().kv_cache_usage)
        return outs

    engine.step = tracked_step
    try:
        return llm.generate(prompts, params, use_tqdm=False, **kwargs), usage
    finally:
        engine.step = step


def reference_tokens(ckpt, prompts, params) -> list[list[int]]:
    llm = LLM(model=str(ckpt), dtype="float32", block_size=4, num_gpu_blocks_override=4096, enable_prefix_caching=False)
    try:
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        llm.shutdown()


def test_200_requests_under_memory_pressure_match_an_unconstrained_run(tiny_llama):
    prompts, params = workload(200, seed=0)
    assert max(len(p["prompt_token_ids"]) for p in prompts) > 16  # the budget below
    llm = LLM(
        model=str(tiny_llama),
        dtype="float32",
        block_size=4,
        num_gpu_blocks_override=40,
        max_num_batched_tokens=16,
        max_num_seqs=16,
    )
    try:
        outs, usage = generate_tracking_usage(llm, prompts, params)
        stats = llm.llm_engine.scheduler_stats()
    finally:
        llm.shutdown()
    assert all(o.finished for o in outs)
    assert [o.outputs[0].token_ids for o in outs] == reference_tokens(tiny_llama, prompts, params)
    assert stats.prefix_cache_hit_rate > 0
    assert stats.num_preemptions > 0
    assert max(usage) <= 1.0
    assert stats.num_free_blocks == stats.num_blocks == 40


def test_priority_policy_under_pressure_matches_an_unconstrained_run(tiny_llama):
    prompts, params = workload(60, seed=1)
    priorities = [random.Random(i).randrange(4) for i in range(60)]
    llm = LLM(
        model=str(tiny_llama),
        dtype="float32",
        block_size=4,
        num_gpu_blocks_override=30,
        max_num_batched_tokens=24,
        max_num_seqs=6,
        scheduling_policy="priority",
    )
    try:
        outs, _ = generate_tracking_usage(llm, prompts, params, priority=priorities)
        stats = llm.llm_engine.scheduler_stats()
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outs] == reference_tokens(tiny_llama, prompts, params)
    assert stats.num_preemptions > 0 and stats.num_free_blocks == 30


def test_cache_salt_isolates_requests(tiny_llama):
    llm = LLM(model=str(tiny_llama), dtype="float32", block_size=4, num_gpu_blocks_override=64)
    engine = llm.llm_engine
    prompt = {"prompt_token_ids": list(range(10, 30))}
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)

    def run(salt):
        before = engine.scheduler_stats().prefix_cache_hits
        engine.add_request(None, prompt, params, cache_salt=salt)
        outs = []
        while engine.has_unfinished_requests():
            outs += [o for o in engine.step() if o.finished]
        return engine.scheduler_stats().prefix_cache_hits - before, outs[0].outputs[0].token_ids

    try:
        first_hits, first = run("alice")
        assert first_hits == 0
        assert run("bob")[0] == 0  # same tokens, other salt
        assert run(None)[0] == 0
        hits, again = run("alice")
        assert hits == 16 and again == first  # 20 tokens: 4 full blocks, the last token recomputed
        with pytest.raises(ValueError, match="cache_salt"):
            engine.add_request(None, prompt, params, cache_salt="")
        assert run("alice")[1] == first  # still serving
    finally:
        llm.shutdown()


def test_requests_sharing_kv_computed_in_the_same_step(tiny_llama):
    """All requests fit one step: the later ones read the system prompt's KV that the
    first one writes in that very forward pass."""
    system = list(range(100, 140))  # 40 tokens = 10 blocks
    prompts = [{"prompt_token_ids": system + [200 + i] * (1 + i % 3)} for i in range(8)]
    params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)] * 8
    llm = LLM(model=str(tiny_llama), dtype="float32", block_size=4, num_gpu_blocks_override=128)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        stats = llm.llm_engine.scheduler_stats()
    finally:
        llm.shutdown()
    assert stats.prefix_cache_hits == 7 * 40
    assert [o.outputs[0].token_ids for o in outs] == reference_tokens(tiny_llama, prompts, params)
