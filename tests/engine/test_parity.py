"""Token-for-token parity with transformers on checkpoints the tests build.

For a batch of prompts of different lengths in fp32: greedy tokens identical
and the chosen tokens' logprobs within 1e-4 of transformers', across block
sizes and under a cache small enough to force preemption.
"""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from tests.hf_reference import hf_greedy

MAX_TOKENS = 10
PROMPT_TEXTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):",
    "x",
    "for i in range(10):\n    print(i)\n# the loop above prints ten numbers, one per line, then the program",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True)


def _prompts(llm: LLM) -> list[list[int]]:
    tok = llm.get_tokenizer()
    return [tok.encode(t) for t in PROMPT_TEXTS]


def _assert_matches(outputs, reference) -> None:
    for out, (ref_tokens, ref_logprobs) in zip(outputs, reference):
        completion = out.outputs[0]
        assert completion.token_ids == ref_tokens
        ours = [lp[t] for lp, t in zip(completion.logprobs, completion.token_ids)]
        assert ours == pytest.approx(ref_logprobs, abs=1e-4)


@pytest.fixture(scope="module", params=["opt_dir", "llama_dir", "llama_tied_dir"])
def checkpoint(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def reference(checkpoint):
    llm = LLM(model=str(checkpoint), dtype="float32", num_gpu_blocks_override=64)
    prompts = _prompts(llm)
    llm.shutdown()
    return prompts, hf_greedy(checkpoint, prompts, MAX_TOKENS)


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_greedy_tokens_and_logprobs_match_transformers(checkpoint, reference, block_size):
    prompts, ref = reference
    llm = LLM(model=str(checkpoint), dtype="float32", block_size=block_size, num_gpu_blocks_override=64)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    _assert_matches(outputs, ref)
    assert llm.llm_engine.scheduler_stats().num_preemptions == 0


def test_preemption_keeps_tokens_identical(checkpoint, reference):
    """Eight blocks of four tokens hold one long request at a time: the scheduler
    must preempt and recompute, and the tokens must not change."""
    prompts, ref = reference
    longest = max(len(p) for p in prompts) + MAX_TOKENS
    blocks = -(-longest // 4) + 1
    llm = LLM(model=str(checkpoint), dtype="float32", block_size=4, num_gpu_blocks_override=blocks)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    _assert_matches(outputs, ref)
    stats = llm.llm_engine.scheduler_stats()
    assert stats.num_preemptions > 0
    assert stats.num_free_blocks == stats.num_blocks


def test_chunked_prefill_with_small_budget_matches(checkpoint, reference):
    prompts, ref = reference
    llm = LLM(
        model=str(checkpoint), dtype="float32", block_size=8, num_gpu_blocks_override=64, max_num_batched_tokens=7
    )
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    _assert_matches(outputs, ref)
