"""n completions per prompt, and per-request seeds that make sampling reproducible
whatever else shares the batch."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams

PROMPT = "for i in range(10):\n    self.data = data\n    return self.data\n"


@pytest.fixture(scope="module")
def llm(llama_dir):
    engine = LLM(model=str(llama_dir), dtype="float32", block_size=8, num_gpu_blocks_override=64)
    yield engine
    engine.shutdown()


def test_n_gives_n_distinct_indexed_completions(llm):
    out = llm.generate(PROMPT, SamplingParams(n=4, temperature=1.0, max_tokens=8), use_tqdm=False)[0]
    assert out.finished and out.request_id
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 4
    assert all(len(c.token_ids) == 8 and c.finish_reason == "length" for c in out.outputs)


def test_n_with_seed_is_reproducible_and_still_distinct(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=123, max_tokens=6)
    first = llm.generate(PROMPT, params, use_tqdm=False)[0]
    again = llm.generate(["import os", PROMPT], [SamplingParams(max_tokens=3), params], use_tqdm=False)[1]
    tokens = [c.token_ids for c in first.outputs]
    assert tokens == [c.token_ids for c in again.outputs]
    assert len({tuple(t) for t in tokens}) == 3  # each child has its own seed (seed + index)


def test_greedy_n_gives_identical_completions(llm):
    out = llm.generate(PROMPT, SamplingParams(n=2, temperature=0, max_tokens=5), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == out.outputs[1].token_ids


def test_seed_gives_the_same_tokens_whatever_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=7, max_tokens=6)
    alone = llm.generate(PROMPT, seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = [
        ("import os\nimport sys", SamplingParams(temperature=1.0, max_tokens=8)),
        ("a a a a", SamplingParams(temperature=0, max_tokens=4, repetition_penalty=1.5)),
        ("class Stack:", SamplingParams(temperature=0.7, top_k=20, seed=99, max_tokens=6)),
    ]
    for position in range(len(others) + 1):
        batch = list(others)
        batch.insert(position, (PROMPT, seeded))
        outs = llm.generate([p for p, _ in batch], [s for _, s in batch], use_tqdm=False)
        assert outs[position].outputs[0].token_ids == alone, f"seeded request at position {position} changed"
    unseeded = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=6)
    assert llm.generate(PROMPT, unseeded, use_tqdm=False)[0].outputs[0].token_ids != alone  # seeds matter


def _peak_blocks(llm, params: list[SamplingParams]) -> int:
    """Most KV blocks in use at once while ``params`` (one request each) run to completion."""
    engine = llm.llm_engine
    for p in params:
        engine.add_request(None, PROMPT, p)
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        stats = engine.scheduler_stats()
        peak = max(peak, stats.num_blocks - stats.num_free_blocks)
    return peak


def test_n_shares_the_prompt_kv_blocks(llm):
    params = SamplingParams(temperature=1.0, max_tokens=4)
    num_prompt = len(llm.get_tokenizer().encode(PROMPT))
    one = _peak_blocks(llm, [params])
    assert one == -(-(num_prompt + 3) // 8)  # prompt + 3 tokens with KV, in blocks of 8
    # children after the first reuse the prompt's full blocks (prefix caching; the last
    # prompt token is always recomputed, so a block holding it is not shared)
    shared = (num_prompt - 1) // 8
    assert shared >= 3
    assert _peak_blocks(llm, [SamplingParams(n=4, temperature=1.0, max_tokens=4)]) == 4 * one - 3 * shared


def test_abort_stops_every_child(llm):
    engine = llm.llm_engine
    req_id = engine.add_request("fan", PROMPT, SamplingParams(n=3, max_tokens=50))
    engine.step()
    engine.abort_request(req_id)
    assert not engine.has_unfinished_requests()
    assert engine.step() == []
