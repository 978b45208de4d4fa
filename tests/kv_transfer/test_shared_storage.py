"""Disaggregated prefill through shared storage: a producer engine computes prompts' KV
(``max_tokens=1``), a consumer engine loads it and decodes. The oracle is one engine
doing both: outputs identical, with the loaded prompt tokens not recomputed."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PREFILL = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
PROMPTS = [
    "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):\n        self.path = path\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
]
KWARGS = dict(dtype="float32", block_size=4, disable_log_stats=True, num_gpu_blocks_override=64, max_model_len=96)


def _engine(llama_dir, path, role, **kwargs):
    config = {"kv_connector": "SharedStorageConnector", "kv_role": role}
    config["kv_connector_extra_config"] = {"shared_storage_path": str(path)}
    return LLM(str(llama_dir), kv_transfer_config=config, **{**KWARGS, **kwargs})


@pytest.fixture(scope="module")
def reference(llama_dir):
    torch.set_num_threads(1)
    return [o.outputs[0].token_ids for o in LLM(str(llama_dir), **KWARGS).generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_consumer_loads_what_the_producer_computed(llama_dir, tmp_path, reference):
    producer = _engine(llama_dir, tmp_path, "kv_producer")
    producer.generate(PROMPTS, PREFILL, use_tqdm=False)
    files = sorted(tmp_path.glob("*.kv"))
    assert files and not list(tmp_path.glob(".*.tmp"))
    consumer = _engine(llama_dir, tmp_path, "kv_consumer")
    outs = consumer.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    for out in outs:
        assert out.num_cached_tokens == (len(out.prompt_token_ids) - 1) // 4 * 4 > 0
    stats = consumer.llm_engine.scheduler_stats()
    assert stats.external_prefix_cache_hits == sum(o.num_cached_tokens for o in outs)
    assert sorted(tmp_path.glob("*.kv")) == files  # a consumer writes nothing


def test_a_miss_is_computed_locally(llama_dir, tmp_path, reference):
    producer = _engine(llama_dir, tmp_path, "kv_producer")
    producer.generate(PROMPTS[0], PREFILL, use_tqdm=False)
    consumer = _engine(llama_dir, tmp_path, "kv_consumer")
    outs = consumer.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert outs[0].num_cached_tokens > 0 and outs[1].num_cached_tokens == 0


def test_a_partly_stored_prefix_loads_its_stored_part(llama_dir, tmp_path, reference):
    """The producer saw only the first half of the prompt: the consumer loads that much."""
    tokenizer = LLM(str(llama_dir), **KWARGS).get_tokenizer()
    ids = tokenizer(PROMPTS[0])["input_ids"]
    producer = _engine(llama_dir, tmp_path, "kv_producer")
    producer.generate({"prompt_token_ids": ids[:20]}, PREFILL, use_tqdm=False)
    out = _engine(llama_dir, tmp_path, "kv_consumer").generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)[0]
    assert out.num_cached_tokens == 20
    assert out.outputs[0].token_ids == reference[0]


def test_two_producers_writing_the_same_prefix(llama_dir, tmp_path, reference):
    first = _engine(llama_dir, tmp_path, "kv_producer")
    second = _engine(llama_dir, tmp_path, "kv_producer")
    first.generate(PROMPTS[0], PREFILL, use_tqdm=False)
    files = {p.name: p.read_bytes() for p in tmp_path.glob("*.kv")}
    second.generate(PROMPTS[0], PREFILL, use_tqdm=False)
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.kv")} == files
    assert not list(tmp_path.glob(".*.tmp"))
    out = _engine(llama_dir, tmp_path, "kv_consumer").generate(PROMPTS[0], GREEDY, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == reference[0]


def test_kv_both_with_chunked_prefill_and_async_scheduling(llama_dir, tmp_path, reference):
    """One engine in both roles, a token budget that splits each prompt and async scheduling:
    the second pass over the same prompts loads them (the device cache reset in between)."""
    llm = _engine(llama_dir, tmp_path, "kv_both", max_num_batched_tokens=16, async_scheduling=True)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == reference
    assert llm.reset_prefix_cache() is True  # the shared files stay
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert all(o.num_cached_tokens == (len(o.prompt_token_ids) - 1) // 4 * 4 for o in outs)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tp2_producer_and_consumer(llama_dir, tmp_path, reference):
    """Each rank writes and reads its own shard's file; a tp=1 engine finds none of them."""
    producer = _engine(llama_dir, tmp_path, "kv_producer", tensor_parallel_size=2)
    try:
        producer.generate(PROMPTS, PREFILL, use_tqdm=False)
    finally:
        producer.shutdown()
    assert {p.name.split(".")[1] for p in tmp_path.glob("*.kv")} == {"tp2r0", "tp2r1"}
    consumer = _engine(llama_dir, tmp_path, "kv_consumer", tensor_parallel_size=2)
    try:
        outs = consumer.generate(PROMPTS, GREEDY, use_tqdm=False)
    finally:
        consumer.shutdown()
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert all(o.num_cached_tokens == (len(o.prompt_token_ids) - 1) // 4 * 4 for o in outs)
    single = _engine(llama_dir, tmp_path, "kv_consumer").generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.num_cached_tokens for o in single] == [0, 0]
