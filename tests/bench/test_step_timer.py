"""StepTimer: per-step records read from the model's own attention metadata."""

from __future__ import annotations

import pytest
import torch

from minivllm.bench.timing import StepTimer, kv_bytes_per_token, matmul_params, roofline, weight_bytes
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_records_every_step_of_one_request(opt_dir, async_scheduling):
    """Async scheduling launches steps through execute_model_async: the shapes are seen there too
    (the last step only collects the final token: it launches nothing and has no shape)."""
    llm = LLM(
        model=str(opt_dir),
        dtype="float32",
        block_size=8,
        num_gpu_blocks_override=32,
        overrides=[f"scheduler.async_scheduling={str(async_scheduling).lower()}"],
    )
    try:
        runner = llm.llm_engine.core.executor.worker.model_runner
        timer = StepTimer(llm.llm_engine.core.executor, runner, torch.device("cpu")).attach()
        engine = llm.llm_engine
        engine.add_request(None, list(range(3, 13)), SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
        while engine.has_unfinished_requests():
            timer.run_step(engine.step)
        # the prefill samples token 1; tokens 2..5 each need one decode step over a context one longer
        assert [(s.num_tokens, s.kv_tokens, s.decode_only) for s in timer.steps] == [
            (10, 10, False),
            (1, 11, True),
            (1, 12, True),
            (1, 13, True),
            (1, 14, True),
        ] + [(0, 0, False)] * async_scheduling
        assert all(0 < s.model_s < s.wall_s for s in timer.steps if s.num_tokens)
        decode = timer.summary(decode_only=True)
        assert decode["num_steps"] == 4
        assert decode["overhead_s"] == decode["step_time_s"] - decode["model_time_s"]
        timer.detach()
        assert "compute_logits" not in vars(runner.model)  # the class methods are back
        assert not {"execute_model", "execute_model_async"} & set(vars(llm.llm_engine.core.executor))
        roof = roofline(timer.steps, runner, torch.device("cpu"), measured_s=1.0)
        per_token = 2 * 2 * 64 * 4  # layers x (K, V) x hidden x fp32 bytes
        assert kv_bytes_per_token(runner.kv_caches) == per_token
        assert roof["bytes_moved"] == 5 * weight_bytes(runner.model) + (10 + 11 + 12 + 13 + 14) * per_token
        body, head = matmul_params(runner.model)
        assert head == runner.model.lm_head.weight.numel() and body > 0
        # every token through the body, one row per request through the head: 14 tokens, 5 steps of one request
        assert roof["matmul_gflop"] * 1e9 == pytest.approx(2 * (body * 14 + head * 5))
        assert roof["gemm_peak_gflop_s"] > 0 and roof["compute_floor_s"] == pytest.approx(
            roof["matmul_gflop"] / roof["gemm_peak_gflop_s"]
        )
    finally:
        llm.shutdown()


def test_weight_bytes_counts_tied_weights_once():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head, "extra": torch.nn.Linear(4, 4, bias=False)})
    assert weight_bytes(model) == (10 * 4 + 4 * 4) * 4


@pytest.mark.gpu
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_cuda_model_time_comes_from_events_read_after_the_run(llama_dir, async_scheduling):
    llm = LLM(
        model=str(llama_dir),
        dtype="bfloat16",
        num_gpu_blocks_override=64,
        overrides=[f"scheduler.async_scheduling={str(async_scheduling).lower()}"],
    )
    try:
        runner = llm.llm_engine.core.executor.worker.model_runner
        timer = StepTimer(llm.llm_engine.core.executor, runner, torch.device("cuda")).attach()
        engine = llm.llm_engine
        engine.add_request(None, list(range(3, 13)), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        while engine.has_unfinished_requests():
            timer.run_step(engine.step)
        launched = [s for s in timer.steps if s.num_tokens]
        assert [s.decode_only for s in launched] == [False] + [True] * 5
        assert all(s.model_s > 0 for s in launched)
        assert sum(s.model_s for s in timer.steps) < sum(s.wall_s for s in timer.steps)
        timer.detach()
    finally:
        llm.shutdown()
