"""bench.mode=serving: replay a workload whose requests arrive over time, in this process.

    python -m minivllm task=bench bench=serving bench.request_rate=8

The engine runs in this process (``LLM.from_config``) and is stepped here; a request
joins the engine once the clock passes its arrival time (Poisson or evenly spaced
at ``bench.request_rate``; ``inf``: all at the start). Every step's new tokens are
timestamped, which gives per request, as vLLM's serving benchmark reports them:

- TTFT  arrival -> first generated token (queueing and prefill included)
- ITL   the gaps between consecutive deliveries of new tokens
- E2E   arrival -> last token

and for the run: output tokens/s from the first arrival to the last token.
No HTTP and no detokenization cost is in these numbers: they measure the engine.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from minivllm.bench.memory import PeakMemory
from minivllm.bench.step_timer import StepTimer
from minivllm.bench.warmup import model_runner, warm_up
from minivllm.bench.workloads import BenchRequest
from minivllm.config.task import BenchConfig
from minivllm.config.vllm_config import VllmConfig
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import RequestOutputKind, SamplingParams

PERCENTILES = (50, 99)


@dataclass
class RequestTiming:
    """One request's clock, in seconds since the replay started."""

    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    output_tokens: int = 0
    gaps: list[float] = field(default_factory=list)

    def deliver(self, now: float, num_tokens: int) -> None:
        if self.first_token is None:
            self.first_token = now
        else:
            self.gaps.append(now - self.last_token)
        self.last_token = now
        self.output_tokens += num_tokens


def arrival_times(cfg: BenchConfig, n: int) -> list[float]:
    """Seconds after the start at which each of ``n`` requests arrives."""
    if math.isinf(cfg.request_rate):
        return [0.0] * n
    if cfg.arrival == "uniform":
        return [i / cfg.request_rate for i in range(n)]
    gaps = np.random.default_rng(cfg.seed + 3).exponential(1.0 / cfg.request_rate, size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[1:])]).tolist()


def replay(llm: LLM, requests: list[BenchRequest], arrivals: list[float], temperature: float) -> list[RequestTiming]:
    """Add each request at its arrival time, step until all finish; the clock of each."""
    engine = llm.llm_engine
    order = deque(sorted(range(len(requests)), key=lambda i: arrivals[i]))
    timings: dict[str, RequestTiming] = {}
    start = time.perf_counter()
    while order or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while order and arrivals[order[0]] <= now:
            i = order.popleft()
            params = SamplingParams(
                temperature=temperature,
                max_tokens=requests[i].max_tokens,
                ignore_eos=True,
                output_kind=RequestOutputKind.DELTA,
            )
            rid = engine.add_request(f"replay-{i}", {"prompt_token_ids": requests[i].prompt_token_ids}, params)
            timings[rid] = RequestTiming(arrivals[i])
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, arrivals[order[0]] - now))  # idle until the next arrival
            continue
        outputs = engine.step()
        now = time.perf_counter() - start
        for out in outputs:
            produced = len(out.outputs[0].token_ids)
            if produced:
                timings[out.request_id].deliver(now, produced)
    return list(timings.values())


def latency_summary(timings: list[RequestTiming]) -> dict[str, Any]:
    """Throughput and the p50/p99/mean of TTFT, ITL and E2E, in milliseconds."""
    done = [t for t in timings if t.first_token is not None]
    duration = max(t.last_token for t in done) - min(t.arrival for t in timings)
    produced = sum(t.output_tokens for t in done)
    series = {
        "ttft": [t.first_token - t.arrival for t in done],
        "itl": [g for t in done for g in t.gaps],
        "e2e": [t.last_token - t.arrival for t in done],
    }
    out: dict[str, Any] = {
        "output_tokens": produced,
        "total_time_s": duration,
        "requests_per_s": len(done) / duration,
        "output_tokens_per_s": produced / duration,
    }
    for name, values in series.items():
        ms = 1e3 * np.asarray(values or [0.0])
        out[f"{name}_mean_ms"] = float(ms.mean())
        for p in PERCENTILES:
            out[f"{name}_p{p}_ms"] = float(np.percentile(ms, p))
    return out


def bench_serving(cfg: VllmConfig, requests: list[BenchRequest]) -> dict[str, Any]:
    """Start the engine with ``cfg``, warm it up, replay the workload at its arrival times."""
    if cfg.parallel.dp > 1:
        raise ValueError(f"parallel.dp={cfg.parallel.dp}: bench.mode=serving steps one engine; use parallel.dp=1")
    peak = PeakMemory(torch.device(cfg.device_type))
    llm = LLM.from_config(cfg)
    try:
        runner = model_runner(llm)
        device = runner.device if runner is not None else torch.device(cfg.device_type)
        timer = StepTimer(llm.llm_engine.core.executor, runner, device).attach()
        if cfg.bench.warmup:
            warm_up(llm, requests[0], cfg, timer)
        timer.detach()
        before = llm.llm_engine.scheduler_stats().num_preemptions
        timings = replay(llm, requests, arrival_times(cfg.bench, len(requests)), cfg.bench.temperature)
        stats = llm.llm_engine.scheduler_stats()
        out = latency_summary(timings)
        out["input_tokens_per_s"] = sum(len(r.prompt_token_ids) for r in requests) / out["total_time_s"]
        out.update(num_kv_blocks=stats.num_blocks, num_preemptions=stats.num_preemptions - before)
        out["request_rate"] = cfg.bench.request_rate
        out["peak_memory_gib"] = peak.read_gib()
    finally:
        llm.shutdown()
    return out
