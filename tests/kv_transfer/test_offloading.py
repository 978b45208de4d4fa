"""The host-memory tier of the prefix cache (``cache.kv_offloading_size``), end to end on the CPU.

The oracle is the same engine without offloading, which recomputes every evicted prefix:
outputs must be identical token for token, while the offloading engine computes fewer
prompt tokens (``num_cached_tokens``) and reports host hits apart from device hits."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = [
    "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):\n        self.path = path\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
]
KWARGS = dict(dtype="float32", block_size=4, disable_log_stats=True, num_gpu_blocks_override=24, max_model_len=96)


@pytest.fixture(scope="module")
def reference(llama_dir):
    torch.set_num_threads(1)
    llm = LLM(str(llama_dir), **KWARGS)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _run_alternating(llm: LLM) -> list:
    """A, then B (whose blocks evict A's from the 24-block device cache), then A again."""
    return [llm.generate(p, GREEDY, use_tqdm=False)[0] for p in (PROMPTS[0], PROMPTS[1], PROMPTS[0])]


def test_evicted_prefix_comes_back_from_host_memory(llama_dir, reference):
    llm = LLM(str(llama_dir), kv_offloading_size=0.01, **KWARGS)
    first, second, again = _run_alternating(llm)
    assert [first.outputs[0].token_ids, second.outputs[0].token_ids] == reference
    assert again.outputs[0].token_ids == reference[0]
    full_blocks = (len(first.prompt_token_ids) - 1) // 4 * 4
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens == full_blocks  # none recomputed: all from the host tier
    stats = llm.llm_engine.scheduler_stats()
    assert stats.external_prefix_cache_hits > 0  # B evicted A's tail from the device
    assert stats.prefix_cache_hits + stats.external_prefix_cache_hits == full_blocks
    without = LLM(str(llama_dir), **KWARGS)
    assert _run_alternating(without)[2].num_cached_tokens == stats.prefix_cache_hits  # the device alone


def test_reset_prefix_cache_forgets_the_host_tier_too(llama_dir, reference):
    """After a weight update the host copies would be stale: a reset drops both tiers."""
    llm = LLM(str(llama_dir), kv_offloading_size=0.01, **KWARGS)
    llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)
    assert llm.reset_prefix_cache() is True
    again = llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens == 0
    assert again.outputs[0].token_ids == reference[0]


def test_metrics_tell_host_hits_from_device_hits(llama_dir):
    llm = LLM(str(llama_dir), kv_offloading_size=0.01, **KWARGS)
    _run_alternating(llm)
    llm.generate(PROMPTS[0], GREEDY, use_tqdm=False)  # now on the device again: a device hit
    metrics = {m.name: m.value for m in llm.get_metrics()}
    assert metrics["vllm:external_prefix_cache_hits"] > 0
    assert metrics["vllm:prefix_cache_hits"] > 0
    assert metrics["vllm:external_prefix_cache_queries"] >= metrics["vllm:external_prefix_cache_hits"]


def test_a_full_host_pool_keeps_the_most_recent_blocks(llama_dir, reference):
    """A pool of 4 blocks: the early blocks of A were overwritten by B's, so A comes back
    partly or not at all, and still right."""
    per_block = LLM(str(llama_dir), kv_offloading_size=0.01, **KWARGS).llm_engine.core.scheduler.connector
    llm = LLM(str(llama_dir), kv_offloading_size=4 * per_block.kv_bytes_per_block / 2**30, **KWARGS)
    assert llm.llm_engine.core.scheduler.connector.num_slots == 4
    first, second, again = _run_alternating(llm)
    assert [first.outputs[0].token_ids, second.outputs[0].token_ids] == reference
    assert again.outputs[0].token_ids == reference[0]
    assert again.num_cached_tokens < (len(first.prompt_token_ids) - 1) // 4 * 4
