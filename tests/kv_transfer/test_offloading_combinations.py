"""The host-memory tier together with preemption, the fp8 KV cache, LoRA, tp=2, and the
CUDA copy stream. The oracle is the same engine without offloading (which recomputes)."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.lora_request import LoRARequest
from tests.executor import tp_helpers as h
from tests.lora.adapters import make_adapter

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
A = "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):\n        self.path = path\n"
B = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
KWARGS = dict(dtype="float32", block_size=4, disable_log_stats=True, num_gpu_blocks_override=24, max_model_len=96)


def _tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def test_preempted_requests_come_back_from_host_memory(llama_dir):
    """Four long decodes in 24 blocks: requests are preempted, their blocks evicted by the
    others and loaded back from the host instead of recomputed."""
    torch.set_num_threads(1)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [A, B, A[:40] + "x", B[:40] + "y"]
    want = _tokens(LLM(str(llama_dir), **KWARGS).generate(prompts, params, use_tqdm=False))
    llm = LLM(str(llama_dir), kv_offloading_size=0.01, **KWARGS)
    assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == want
    stats = llm.llm_engine.scheduler_stats()
    assert stats.num_preemptions > 0
    assert stats.external_prefix_cache_hits > 0


def test_fp8_kv_cache_blocks_round_trip(llama_dir):
    kwargs = {**KWARGS, "kv_cache_dtype": "fp8"}
    ref = LLM(str(llama_dir), **kwargs)
    want = [ref.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in (A, B, A)]
    llm = LLM(str(llama_dir), kv_offloading_size=0.01, **kwargs)
    outs = [llm.generate(p, GREEDY, use_tqdm=False)[0] for p in (A, B, A)]
    assert _tokens(outs) == want
    assert llm.llm_engine.scheduler_stats().external_prefix_cache_hits > 0


def test_host_blocks_are_never_shared_across_adapters(llama_dir, tmp_path):
    """The adapter id is in the block hash: the same prompt under another adapter misses the
    host tier, and each adapter's outputs equal the engine without offloading."""
    adapter = LoRARequest("one", 1, str(make_adapter(llama_dir, tmp_path / "one")))
    kwargs = {**KWARGS, "enable_lora": True, "max_lora_rank": 8}
    runs = [(A, None), (B, None), (A, adapter), (B, None), (A, None)]
    ref = LLM(str(llama_dir), **kwargs)
    want = [ref.generate(p, GREEDY, lora_request=r, use_tqdm=False)[0].outputs[0].token_ids for p, r in runs]
    llm = LLM(str(llama_dir), kv_offloading_size=0.01, **kwargs)
    outs = [llm.generate(p, GREEDY, lora_request=r, use_tqdm=False)[0] for p, r in runs]
    assert _tokens(outs) == want
    assert outs[2].num_cached_tokens == 0  # A was saved without the adapter
    assert outs[4].num_cached_tokens > 0  # and comes back without it


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tp2_each_rank_offloads_its_own_shard(llama_dir):
    kwargs = {**h.LLM_KWARGS, "num_gpu_blocks_override": 16, "block_size": 4}
    ref = LLM(str(llama_dir), **kwargs)
    want = [ref.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in (A, B, A)]
    ref.shutdown()
    llm = LLM(str(llama_dir), tensor_parallel_size=2, kv_offloading_size=0.01, **kwargs)
    try:
        outs = [llm.generate(p, GREEDY, use_tqdm=False)[0] for p in (A, B, A)]
        assert _tokens(outs) == want
        assert llm.llm_engine.scheduler_stats().external_prefix_cache_hits > 0
        pools = llm.collective_rpc(lambda worker: tuple(worker.model_runner.kv_connector.pool.shape))
        assert len(pools) == 2 and pools[0] == pools[1]  # half the size, half the heads on each rank
    finally:
        llm.shutdown()


@pytest.mark.gpu
def test_cuda_copies_run_on_their_own_stream(llama_dir):
    """On CUDA the host pool is pinned and copies go through the connector's stream; the outputs
    stay those of the engine that recomputes."""
    kwargs = {**KWARGS, "device": "cuda"}
    ref = LLM(str(llama_dir), **kwargs)
    want = [ref.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in (A, B, A)]
    llm = LLM(str(llama_dir), kv_offloading_size=0.01, **kwargs)
    outs = [llm.generate(p, GREEDY, use_tqdm=False)[0] for p in (A, B, A)]
    assert _tokens(outs) == want
    assert outs[2].num_cached_tokens == (len(outs[2].prompt_token_ids) - 1) // 4 * 4
    assert llm.llm_engine.scheduler_stats().external_prefix_cache_hits > 0
    pinned, stream = llm.collective_rpc(
        lambda w: (w.model_runner.kv_connector.pool.is_pinned(), w.model_runner.kv_connector.stream is not None)
    )[0]
    assert pinned and stream


def test_sleep_mode_lets_go_of_the_cache_and_forgets_the_host_tier(llama_dir):
    """Sleeping frees the KV cache (the connector keeps no view of it) and resets the prefix
    cache, host copies included; after waking the engine offloads into the new tensors."""
    llm = LLM(str(llama_dir), kv_offloading_size=0.01, enable_sleep_mode=True, **KWARGS)
    want = [llm.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in (A, B)]
    llm.sleep(level=1)
    assert llm.collective_rpc(lambda w: len(w.model_runner.kv_connector._layers)) == [0]
    llm.wake_up()
    outs = [llm.generate(p, GREEDY, use_tqdm=False)[0] for p in (A, B, A)]
    assert _tokens(outs) == [want[0], want[1], want[0]]
    assert outs[0].num_cached_tokens == 0  # nothing survived the sleep
    assert outs[2].num_cached_tokens > 0  # the new cache's blocks were offloaded
