"""The Triton backend inside the whole engine: same greedy tokens as the torch backend."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from tests.model_configs import gemma2_config, gpt_oss_config, mistral_config

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "x = [i * i for i in range(10)]"]


CONFIGS = {
    "mistral-window5-mqa": mistral_config,
    "gemma2-softcaps-window6-alternating": gemma2_config,
    "gpt-oss-sinks-window5-alternating-yarn": gpt_oss_config,
}


@pytest.fixture(params=["llama-gqa", *CONFIGS])
def checkpoint(request, llama_dir, make_checkpoint):
    """Llama with GQA; Mistral whose 5-token sliding window is shorter than the prompts;
    Gemma 2 with per-layer windows (window 6, global, window 6) and soft-capped scores; gpt-oss
    with attention sinks on alternating windowed and full layers."""
    return llama_dir if request.param == "llama-gqa" else make_checkpoint(request.param, CONFIGS[request.param]())


def test_triton_backend_matches_torch_backend_end_to_end(checkpoint):
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=0)
    results = {}
    for backend in ("torch", "triton"):
        llm = LLM(
            model=str(checkpoint),
            dtype="float32",
            block_size=8,
            num_gpu_blocks_override=32,
            attention_backend=backend,
            max_num_batched_tokens=16,  # chunked prefill + mixed batches
        )
        assert llm.llm_engine.core.executor.worker.model_runner.attn_backend.name == backend
        results[backend] = llm.generate(PROMPTS, params, use_tqdm=False)
    for a, b in zip(results["torch"], results["triton"]):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for lp_a, lp_b, t in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, a.outputs[0].token_ids):
            assert abs(lp_a[t] - lp_b[t]) < 1e-4
