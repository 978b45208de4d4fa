"""StepTimer: per-step records read from the model's own attention metadata."""

from __future__ import annotations

import pytest
import torch

from minivllm.bench.timing import (
    ComputeShape,
    StepRecord,
    StepTimer,
    compute_shape,
    kv_bytes_per_token,
    measure_copy_bandwidth,
    measure_gemm_rate,
    roofline,
    weight_bytes,
)
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
        # causal pairs: the prefill's 10 x 11 / 2, then each decode token over its whole context
        assert [s.attn_pairs for s in timer.steps if s.num_tokens] == [55, 11, 12, 13, 14]
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
        assert roof["floor_s"] == pytest.approx(roof["decode_floor_s"] + roof["prefill_floor_s"])
        assert roof["prefill_floor_s"] == max(roof["prefill_compute_floor_s"], roof["prefill_memory_floor_s"])
        hf = runner.cfg.hf_text_config
        shape = compute_shape(runner.model, hf.vocab_size, hf.num_hidden_layers, hf.num_attention_heads, 16)
        assert roof["flops"] == sum(shape.flops(s) for s in timer.steps)
        assert roof["decode_measured_s"] == sum(s.wall_s for s in timer.steps if s.decode_only)
    finally:
        llm.shutdown()


def test_compute_shape_counts_gemm_weights_not_lookups():
    """Per token: the 2-D weights that are not embeddings; per request: the LM head (vocab x hidden)."""
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict(
        {
            "embed_tokens": emb,
            "embed_positions": torch.nn.Embedding(32, 4),
            "lm_head": head,
            "mlp": torch.nn.Linear(4, 6),  # 24 weights; its bias is no GEMM
            "experts": torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(2, 3, 4))]),
        }
    )
    shape = compute_shape(model, vocab_size=10, num_layers=2, num_heads=3, head_dim=8)
    assert shape == ComputeShape(matmul_params=24 + 24, logits_params=40, attn_flops_per_pair=4 * 2 * 3 * 8)
    step = StepRecord(wall_s=0.0, model_s=0.0, num_tokens=5, num_reqs=2, kv_tokens=9, decode_only=False, attn_pairs=7)
    assert shape.flops(step) == 2 * 48 * 5 + 2 * 40 * 2 + 192 * 7


def test_bandwidth_and_gemm_rate_are_measured():
    assert measure_copy_bandwidth(torch.device("cpu"), num_bytes=8 << 20, repeats=2) > 1e8
    assert measure_gemm_rate(torch.device("cpu"), torch.float32, size=64, repeats=2) > 1e6
    if torch.backends.mkldnn.is_available():  # the engine's packed CPU matmul (device.cpu_packed_linear)
        assert measure_gemm_rate(torch.device("cpu"), torch.float32, size=64, repeats=2, packed=True) > 1e6


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
