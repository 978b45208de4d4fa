"""``compilation.torch_compile=true`` on the CPU (inductor's C++ backend for the small ops) generates
transformers' tokens, through prefill, decode at several batch sizes and the in-place decode attention."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from minivllm.models.utils import FUSABLE
from tests.hf_reference import hf_greedy


@pytest.mark.slow
def test_compiled_small_ops_on_the_cpu_match_transformers(llama_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))  # inductor's cache goes under minivllm's
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    prompts = [[1, 5, 9, 13, 2, 7], [3, 4], [11, 12, 13, 14, 15, 16, 17, 18, 19]]  # decode batches of 3, 2, 1
    llm = LLM(
        model=str(llama_dir),
        dtype="float32",
        device="cpu",
        num_gpu_blocks_override=32,
        overrides=["compilation.torch_compile=true"],
    )
    try:
        runner = llm.llm_engine.core.executor.worker.model_runner
        compiled = [m for m in runner.model.modules() if isinstance(m, FUSABLE)]
        assert compiled and all("forward" in vars(m) for m in compiled)  # the compiled forwards are in place
        max_tokens = [12, 6, 3]
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in max_tokens],
        )
    finally:
        llm.shutdown()
    for p, n, out in zip(prompts, max_tokens, outs):
        ((expected, _),) = hf_greedy(llama_dir, [p], n)
        assert list(out.outputs[0].token_ids) == expected
    assert any((tmp_path / "inductor").iterdir())
