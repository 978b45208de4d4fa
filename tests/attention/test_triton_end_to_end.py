"""The Triton backend inside the whole engine: same greedy tokens as the torch backend."""
from __future__ import annotations

from minivllm import LLM, SamplingParams

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "x = [i * i for i in range(10)]"]


def test_triton_backend_matches_torch_backend_end_to_end(llama_dir):
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=0)
    results = {}
    for backend in ("torch", "triton"):
        llm = LLM(
            model=str(llama_dir), dtype="float32", block_size=8, num_gpu_blocks_override=32,
            attention_backend=backend, max_num_batched_tokens=16,  # chunked prefill + mixed batches
        )
        assert llm.llm_engine.core.executor.worker.model_runner.attn_backend.name == backend
        results[backend] = llm.generate(PROMPTS, params, use_tqdm=False)
    for a, b in zip(results["torch"], results["triton"]):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for lp_a, lp_b, t in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, a.outputs[0].token_ids):
            assert abs(lp_a[t] - lp_b[t]) < 1e-4
