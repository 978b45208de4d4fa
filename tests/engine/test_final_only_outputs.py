"""Final-only requests: the engine core reports them only with their first token and when
they finish, yet the final outputs and the per-step token counts equal those of the same
requests streamed as deltas (the engine without the shortcut)."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from minivllm.sampling_params import RequestOutputKind

PROMPTS = ["def parse(self, text):\n    ", "import os\n", "class A:\n    def __init__(self"]


@pytest.fixture(scope="module")
def llm(llama_dir):
    engine = LLM(model=str(llama_dir), dtype="float32", block_size=8, num_gpu_blocks_override=64)
    yield engine
    engine.shutdown()


def _run(llm, kind: RequestOutputKind) -> tuple[dict, list[int], dict]:
    """Final texts and token ids per request, generated tokens per step, core outputs per request."""
    engine = llm.llm_engine
    params = [
        SamplingParams(temperature=0, max_tokens=12, output_kind=kind),
        SamplingParams(temperature=0.8, seed=3, max_tokens=9, n=2, output_kind=kind),
        SamplingParams(temperature=0, max_tokens=1, output_kind=kind),
    ]
    for i, (prompt, p) in enumerate(zip(PROMPTS, params)):
        engine.add_request(str(i), prompt, p)
    core_outputs: dict[str, int] = {}
    core_step = engine.core.step

    def counting_step():
        outs = core_step()
        for o in outs:
            core_outputs[o.req_id] = core_outputs.get(o.req_id, 0) + 1
        return outs

    engine.core.step = counting_step
    per_step, final = [], {}
    before = engine.counters.num_generation_tokens
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                text, ids = final.get(out.request_id, ({}, {}))
                for c in out.outputs:  # deltas accumulate; a final-only output holds everything
                    text[c.index] = text.get(c.index, "") + c.text
                    ids[c.index] = ids.get(c.index, []) + list(c.token_ids)
                final[out.request_id] = (text, ids)
            per_step.append(engine.counters.num_generation_tokens - before)
    finally:
        engine.core.step = core_step
    return final, per_step, core_outputs


def test_final_only_requests_skip_the_outputs_in_between(llm):
    streamed, streamed_counts, streamed_core = _run(llm, RequestOutputKind.DELTA)
    final, counts, core = _run(llm, RequestOutputKind.FINAL_ONLY)
    assert final == streamed
    assert counts == streamed_counts  # generated tokens are counted in the step that sampled them
    assert max(streamed_core.values()) >= 9  # streamed: one core output per token
    assert core == {"0": 2, "0_1": 2, "1_1": 2, "2": 1}
