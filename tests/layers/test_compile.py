"""compilation.torch_compile: the fused small ops give the same tokens as eager."""

from __future__ import annotations

from minivllm import LLM, SamplingParams
from minivllm.models.utils import FUSABLE


def test_compiled_small_ops_match_eager(llama_dir):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    results = {}
    for compiled in (False, True):
        llm = LLM(
            model=str(llama_dir),
            dtype="float32",
            num_gpu_blocks_override=32,
            overrides=[f"compilation.torch_compile={compiled}"],
        )
        model = llm.llm_engine.core.executor.worker.model_runner.model
        wrapped = [m for m in model.modules() if isinstance(m, FUSABLE) and "forward" in m.__dict__]
        assert bool(wrapped) == compiled
        results[compiled] = llm.generate(["def f():", "import os"], params, use_tqdm=False)
    for eager, comp in zip(results[False], results[True]):
        assert eager.outputs[0].token_ids == comp.outputs[0].token_ids
        for a, b, t in zip(eager.outputs[0].logprobs, comp.outputs[0].logprobs, eager.outputs[0].token_ids):
            assert abs(a[t] - b[t]) < 1e-4
