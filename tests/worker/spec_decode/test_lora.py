"""Speculation with LoRA adapters: a drafted row runs under its request's adapter at every
position (the LoRA token slots cover the drafts), so outputs equal transformers + peft.

The proposer is replaced by one that drafts the oracle's own continuation, so drafts
are accepted exactly where the adapted model agrees with peft at the draft positions."""

from __future__ import annotations

from minivllm import SamplingParams
from minivllm.entrypoints.llm import LLM
from minivllm.lora import LoRARequest
from tests.lora.adapters import make_adapter, peft_greedy

PROMPTS = [[10, 11, 12, 13, 40, 41, 42], [7, 8, 9, 30, 31]]


def test_ngram_speculation_under_adapters_equals_peft(llama_dir, tmp_path):
    adapter = make_adapter(llama_dir, tmp_path / "a", rank=4, alpha=8, seed=3)
    expected = peft_greedy(llama_dir, adapter, PROMPTS[:1], 16) + peft_greedy(llama_dir, None, PROMPTS[1:], 16)
    llm = LLM(
        str(llama_dir),
        dtype="float32",
        device="cpu",
        block_size=4,
        num_gpu_blocks_override=64,
        enable_lora=True,
        max_loras=1,
        max_lora_rank=8,
        speculative_config={"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    )

    def oracle(token_ids, max_num_drafts=None):
        for prompt, out in zip(PROMPTS, expected):
            if list(token_ids[: len(prompt)]) == prompt:
                n = len(token_ids) - len(prompt)
                return out[n : n + min(3, max_num_drafts or 3)]
        raise AssertionError("unknown request")

    llm.llm_engine.core.scheduler.spec.proposer.propose = oracle
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    lora = LoRARequest("a", 1, str(adapter))
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False, lora_request=[lora, None])
    stats = llm.llm_engine.get_stats().spec_decoding
    llm.shutdown()
    assert [list(o.outputs[0].token_ids) for o in outs] == expected
    assert stats.acceptance_rate > 0.9  # the adapted rows agree with peft at every draft position
