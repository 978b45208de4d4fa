"""One huge-n request cannot hold back a small one: with 4 seats and a request of
64 sequences running, a request that arrives after it finishes within a bounded
number of engine steps (first-come-first-served would make it wait for all 16
rounds of the huge one)."""

from __future__ import annotations

from minivllm import LLM, SamplingParams

SEATS, HUGE_N, HUGE_TOKENS, SMALL_TOKENS = 4, 64, 8, 2


def test_small_request_finishes_within_bounded_steps_beside_a_huge_n(llama_dir):
    kwargs = dict(dtype="float32", block_size=8, num_gpu_blocks_override=64, max_num_seqs=SEATS)
    llm = LLM(model=str(llama_dir), **kwargs)
    try:
        engine = llm.llm_engine
        huge = SamplingParams(n=HUGE_N, max_tokens=HUGE_TOKENS, temperature=0, ignore_eos=True)
        engine.add_request("huge", "def f(x):", huge)
        engine.step()  # the huge request holds every seat
        engine.add_request(
            "small", "import os", SamplingParams(max_tokens=SMALL_TOKENS, temperature=0, ignore_eos=True)
        )
        finished: dict[str, int] = {}
        steps = 1
        while "small" not in finished:
            steps += 1
            finished.update({o.request_id: steps for o in engine.step() if o.finished})
            assert steps < 200, "the small request never finished"
        # a seat frees after one round of the huge request; then the small request runs
        assert steps <= 2 * HUGE_TOKENS + SMALL_TOKENS
        assert "huge" not in finished and engine.has_unfinished_requests()
        fcfs_bound = (HUGE_N // SEATS) * HUGE_TOKENS
        assert steps < fcfs_bound / 4
    finally:
        llm.shutdown()


def test_a_batch_of_prompts_in_one_group_takes_turns_too(llama_dir):
    """A server request with many prompts is one group: its sequences share a lane."""
    kwargs = dict(dtype="float32", block_size=8, num_gpu_blocks_override=64, max_num_seqs=SEATS)
    llm = LLM(model=str(llama_dir), **kwargs)
    try:
        engine = llm.llm_engine
        params = SamplingParams(n=4, max_tokens=HUGE_TOKENS, temperature=0, ignore_eos=True)
        for i in range(HUGE_N // 4):
            engine.add_request(f"batch-{i}", f"x = {i}", params, group_id="batch")
        engine.step()
        engine.add_request(
            "small", "import os", SamplingParams(max_tokens=SMALL_TOKENS, temperature=0, ignore_eos=True)
        )
        steps = 1
        while not any(o.request_id == "small" and o.finished for o in engine.step()):
            steps += 1
            assert steps < 200, "the small request never finished"
        assert steps + 1 <= 2 * HUGE_TOKENS + SMALL_TOKENS
    finally:
        llm.shutdown()
