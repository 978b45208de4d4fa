"""``LLM.get_metrics()``: the engine's counters and gauges as vLLM's metric records.

vLLM returns Prometheus samples (``Counter``, ``Gauge``) named ``vllm:*``; these
are the same names, under ``serve.metrics_prefix`` as the server's /metrics are,
read from the engine's own totals (no Prometheus registry).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.config.task import metric_name
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


def engine_metrics(stats: EngineStats, num_finished: int, model_name: str, prefix: str) -> list[Metric]:
    labels = {"model_name": model_name}

    def name(metric: str) -> str:
        return metric_name(prefix, metric)

    return [
        Gauge(name("num_requests_running"), dict(labels), float(stats.num_running)),
        Gauge(name("num_requests_waiting"), dict(labels), float(stats.num_waiting)),
        Gauge(name("kv_cache_usage_perc"), dict(labels), stats.kv_cache_usage),
        Counter(name("prompt_tokens"), dict(labels), stats.num_prompt_tokens),
        Counter(name("generation_tokens"), dict(labels), stats.num_generation_tokens),
        Counter(name("request_success"), dict(labels), num_finished),
        Counter(name("num_preemptions"), dict(labels), stats.num_preemptions),
        Counter(name("prefix_cache_queries"), dict(labels), stats.prefix_cache_queries),
        Counter(name("prefix_cache_hits"), dict(labels), stats.prefix_cache_hits),
    ]
