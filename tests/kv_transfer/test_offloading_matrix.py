"""The host-memory tier in the composition workload (tests/composition/): engines with a small
device cache (preemptions), prefix caching, and chunked prefill, async scheduling, n-gram
speculation, the fp8 KV cache or LoRA. The workload runs twice; each run must give the plain
engine's outputs, and the second finds prefixes in host memory."""

from __future__ import annotations

import pytest

from minivllm import LLM
from tests.composition.cells import engine_kwargs, plain_cell
from tests.composition.oracle import assert_same_as_reference
from tests.composition.test_matrix import adapter, generate, references, specs  # noqa: F401 (fixtures)

CELLS = [
    plain_cell(prefix_caching=True, small_kv_cache=True, chunked_prefill=True, async_scheduling=True),
    plain_cell(prefix_caching=True, small_kv_cache=True, speculative="ngram", kv_cache_dtype="fp8"),
    plain_cell(prefix_caching=True, small_kv_cache=True, chunked_prefill=True, lora=True),
]


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.id)
def test_offloading_cell_gives_the_reference_outputs(cell, llama_dir, adapter, specs, references):  # noqa: F811
    reference = references(cell)
    llm = LLM(str(llama_dir), kv_offloading_size=0.05, **engine_kwargs(cell))
    try:
        runs = [generate(llm, specs, adapter if cell["lora"] else None) for _ in range(2)]
        engine = llm.llm_engine
        stats = engine.get_stats()
        assert engine.core.scheduler.kv.num_free_blocks == engine.num_kv_blocks  # nothing leaked
    finally:
        llm.shutdown()
    for outputs in runs:
        assert_same_as_reference(cell, specs, outputs, reference)
    assert stats.num_preemptions > 0
    assert stats.external_prefix_cache_hits > 0
    assert sum(o.num_cached_tokens for o in runs[1]) > sum(o.num_cached_tokens for o in runs[0])
