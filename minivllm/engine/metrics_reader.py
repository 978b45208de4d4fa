"""``LLM.get_metrics()``: the engine's counters and gauges as vLLM's metric records.

vLLM returns Prometheus samples (``Counter``, ``Gauge``) named ``vllm:*``; these
are the same names, read from the engine's own totals (no Prometheus registry).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.engine.stats import EngineStats


@dataclass
class Metric:
    name: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Counter(Metric):
    value: int = 0


@dataclass
class Gauge(Metric):
    value: float = 0.0


def engine_metrics(stats: EngineStats, num_finished: int, model_name: str) -> list[Metric]:
    labels = {"model_name": model_name}
    return [
        Gauge("vllm:num_requests_running", dict(labels), float(stats.num_running)),
        Gauge("vllm:num_requests_waiting", dict(labels), float(stats.num_waiting)),
        Gauge("vllm:kv_cache_usage_perc", dict(labels), stats.kv_cache_usage),
        Counter("vllm:prompt_tokens", dict(labels), stats.num_prompt_tokens),
        Counter("vllm:generation_tokens", dict(labels), stats.num_generation_tokens),
        Counter("vllm:request_success", dict(labels), num_finished),
        Counter("vllm:num_preemptions", dict(labels), stats.num_preemptions),
        Counter("vllm:prefix_cache_queries", dict(labels), stats.prefix_cache_queries),
        Counter("vllm:prefix_cache_hits", dict(labels), stats.prefix_cache_hits),
    ]
