"""LoRA adapters against transformers + peft: greedy tokens identical, alone and mixed in one batch."""

from __future__ import annotations

import pytest

from minivllm import SamplingParams
from minivllm.entrypoints.llm import LLM
from minivllm.lora import LoRARequest
from tests.engine.test_multi_step import spy_on_steps
from tests.lora.adapters import make_adapter, peft_greedy
from tests.model_configs import llama_config, qwen2_config

PROMPTS = [[5, 17, 42, 9, 77, 31], [100, 3, 250, 61], [8, 8, 19, 200, 140, 66, 12]]
MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def _llm(base, **kw) -> LLM:
    return LLM(str(base), dtype="float32", device="cpu", block_size=4, enable_lora=True, **kw)


def _tokens(outs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def llama_base(make_checkpoint):
    return make_checkpoint("llama-gqa-untied", llama_config(tie=False))


@pytest.fixture(scope="module")
def qwen2_base(make_checkpoint):
    return make_checkpoint("qwen2-lora", qwen2_config(use_sliding_window=False))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_adapter_matches_peft(arch, llama_base, qwen2_base, tmp_path):
    base = llama_base if arch == "llama" else qwen2_base
    adapter = make_adapter(base, tmp_path / "a", rank=8, alpha=16, seed=1)
    expected = peft_greedy(base, adapter, PROMPTS, MAX_TOKENS)
    assert expected != peft_greedy(base, None, PROMPTS, MAX_TOKENS)  # the adapter changes the output
    llm = _llm(base, max_lora_rank=8)
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=LoRARequest("a", 1, str(adapter)))
    assert _tokens(outs) == expected


def test_rslora_and_partial_targets_match_peft(llama_base, tmp_path):
    adapter = make_adapter(
        llama_base, tmp_path / "rs", rank=4, alpha=8, seed=2, targets=["q_proj", "v_proj", "down_proj"], use_rslora=True
    )
    expected = peft_greedy(llama_base, adapter, PROMPTS, MAX_TOKENS)
    outs = _llm(llama_base).generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=LoRARequest("rs", 1, str(adapter)))
    assert _tokens(outs) == expected


def test_mixed_batch_and_more_adapters_than_slots(llama_base, tmp_path):
    """Three adapters and the base model in one call; with max_loras=3 and then 1 slot, and with
    3 slots and multi-step decoding (every step of a batch reads its rows' adapters)."""
    adapters = [make_adapter(llama_base, tmp_path / f"m{i}", rank=4 * (i + 1), alpha=16, seed=10 + i) for i in range(3)]
    loras = [LoRARequest(f"m{i}", i + 1, str(a)) for i, a in enumerate(adapters)] + [None]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(4)]
    alone = [peft_greedy(llama_base, a, [p], MAX_TOKENS)[0] for a, p in zip([*adapters, None], prompts)]
    for max_loras, steps in ((3, 1), (1, 1), (3, 4)):
        llm = _llm(llama_base, max_loras=max_loras, max_cpu_loras=3, num_scheduler_steps=steps)
        seen = spy_on_steps(llm.llm_engine)
        assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=loras)) == alone
        assert steps == 1 or steps in seen
        manager = llm.llm_engine.core.executor.worker.model_runner.lora
        assert manager.num_loads == 3
        assert manager.num_evictions == (0 if max_loras == 3 else 2)


def test_tp2_equals_tp1(llama_base, tmp_path):
    """Two worker processes: column-parallel B and row-parallel A slices (one case: processes are slow)."""
    adapters = [make_adapter(llama_base, tmp_path / f"t{i}", rank=4, alpha=8, seed=30 + i) for i in range(2)]
    loras = [LoRARequest(f"t{i}", i + 1, str(a)) for i, a in enumerate(adapters)] + [None]
    expected = [peft_greedy(llama_base, a, [p], MAX_TOKENS)[0] for a, p in zip([*adapters, None], PROMPTS)]
    llm = _llm(llama_base, max_loras=2, max_lora_rank=8, tensor_parallel_size=2)
    try:
        assert _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False, lora_request=loras)) == expected
    finally:
        llm.shutdown()
