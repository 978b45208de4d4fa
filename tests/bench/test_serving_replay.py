"""bench=serving: arrivals over time, per-request timings, the latency percentiles."""

from __future__ import annotations

import numpy as np
import pytest

from minivllm.bench.run import RequestTiming, arrival_times, latency_summary
from minivllm.bench.workloads import build_workload
from minivllm.cli.main import run
from minivllm.config.store import compose
from minivllm.config.task import BenchConfig


def test_arrivals():
    assert arrival_times(BenchConfig(request_rate=float("inf")), 3) == [0.0, 0.0, 0.0]
    assert arrival_times(BenchConfig(request_rate=4.0, arrival="uniform"), 3) == [0.0, 0.25, 0.5]
    poisson = np.diff(arrival_times(BenchConfig(request_rate=10.0), 4001))
    assert poisson.min() >= 0 and poisson.mean() == pytest.approx(0.1, rel=0.06)
    assert np.std(poisson) == pytest.approx(0.1, rel=0.1)  # exponential gaps: std = mean
    with pytest.raises(ValueError, match="bench.request_rate"):
        BenchConfig(request_rate=0.0)
    with pytest.raises(ValueError, match="bench.arrival"):
        BenchConfig(arrival="bursty")


def test_latency_summary_against_a_direct_computation():
    a = RequestTiming(arrival=0.0)
    for t in (0.10, 0.12, 0.15):
        a.deliver(t, 1)
    b = RequestTiming(arrival=0.05)
    for t in (0.30, 0.31):
        b.deliver(t, 2)
    out = latency_summary([a, b])
    assert out["output_tokens"] == 7 and out["total_time_s"] == pytest.approx(0.31)
    assert out["output_tokens_per_s"] == pytest.approx(7 / 0.31)
    assert out["ttft_p50_ms"] == pytest.approx(np.percentile([100, 250], 50))
    assert out["itl_p99_ms"] == pytest.approx(np.percentile([20, 30, 10], 99))
    assert out["e2e_p99_ms"] == pytest.approx(np.percentile([150, 260], 99))


@pytest.mark.parametrize("ratio, shared", [(1.0, 8), (0.5, 4), (0.25, 2), (0.0, 0)])
def test_shared_prefix_ratio(ratio, shared):
    cfg = BenchConfig(workload="shared_prefix", num_prompts=8, prefix_len=16, num_prefixes=1, prefix_ratio=ratio)
    requests = build_workload(cfg, vocab_size=1000, max_model_len=512)
    prefix = build_workload(BenchConfig(**{**cfg.__dict__, "prefix_ratio": 1.0}), 1000, 512)[0].prompt_token_ids[:16]
    assert sum(r.prompt_token_ids[:16] == prefix for r in requests) == shared
    assert all(cfg.min_input_len + 16 <= len(r.prompt_token_ids) <= cfg.max_input_len + 16 for r in requests)


def test_serving_bench_runs_in_process(opt_dir, tmp_path):
    overrides = [
        f"model.path={opt_dir}",
        "task=bench",
        "bench=serving",
        "bench.num_prompts=4",
        "bench.prefix_len=8",
        "bench.min_input_len=4",
        "bench.max_input_len=8",
        "bench.min_output_len=3",
        "bench.max_output_len=6",
        "bench.arrival=uniform",
        "bench.request_rate=40",
        "bench.warmup=false",
        "bench.progress=false",
        "cache.num_gpu_blocks_override=64",
        "cache.block_size=8",
    ]
    m = run(compose(overrides), tmp_path)
    assert m["mode"] == "serving" and m["output_tokens"] == m["requested_output_tokens"]
    assert m["total_time_s"] >= 3 / 40  # the last request arrives 75 ms after the first
    for name in ("ttft", "itl", "e2e"):
        assert 0 < m[f"{name}_p50_ms"] <= m[f"{name}_p99_ms"]
    assert m["ttft_p99_ms"] <= m["e2e_p99_ms"]
    assert "single_request" not in m and (tmp_path / "metrics.json").is_file()
