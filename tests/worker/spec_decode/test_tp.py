"""Speculative decoding under tensor parallelism (tp=2, two CPU processes): the ranks
agree on the verified tokens, and the outputs equal tp=1's."""

from __future__ import annotations

import gc

from minivllm import LLM, SamplingParams
from tests.executor import tp_helpers as h

PROMPTS = [
    "class Stack:\n    def push(self, x):\n        self.items.append(x)\n    def push(self, x):\n",
    "def fibonacci(n):\n",
]
PARAMS = [
    SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
    SamplingParams(temperature=0.8, seed=3, max_tokens=24, ignore_eos=True),
]
SPEC = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def _outputs(**kwargs) -> tuple[list[list[int]], int]:
    llm = LLM("demo", dtype="float32", speculative_config=SPEC, **kwargs)
    try:
        outs = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]
        return outs, llm.llm_engine.get_stats().spec_decoding.num_accepted_tokens
    finally:
        llm.shutdown()


def test_tp2_matches_tp1():
    before = h.child_pids()
    expected, _ = _outputs()
    actual, accepted = _outputs(tensor_parallel_size=2)
    assert actual == expected
    assert accepted > 0
    gc.collect()
    assert h.wait_until(lambda: not (h.child_pids() - before), timeout=10)
