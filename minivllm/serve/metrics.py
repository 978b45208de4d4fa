"""GET /metrics: Prometheus text, with vLLM's metric names (``vllm:prompt_tokens_total``, ...).

The prefix is ``serve.metrics_prefix`` (``vllm`` by default, so a vLLM dashboard
or alert reads this server as it is); ``LLM.get_metrics()`` uses the same names.

Request-level numbers (tokens, TTFT, inter-token latency, end-to-end latency)
are observed in the front end as outputs arrive, through ``AsyncLLM``'s stat
logger hooks. Engine-level gauges (running, waiting, KV usage) are read fresh
from the engine at each scrape. Each server has its own registry, so two servers
in one process never share counters.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from minivllm.config.task import metric_name
from minivllm.core.scheduler import SchedulerStats
from minivllm.engine.request_stream import RequestStream

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class ServerMetrics:
    """Implements ``AsyncLLM``'s StatLogger; renders the registry as Prometheus text."""

    def __init__(self, model_name: str, prefix: str) -> None:
        self.registry = CollectorRegistry()
        self.engine = _EngineCollector(model_name, prefix)
        self.registry.register(self.engine)
        labels, reg = ["model_name"], self.registry

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(metric_name(prefix, name), doc, labels, buckets=buckets, registry=reg).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(metric_name(prefix, name), doc, labels, registry=reg).labels(model_name)

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self._finished = Counter(
            metric_name(prefix, "request_success"),
            "Finished requests by finish reason.",
            ["model_name", "finished_reason"],
            registry=reg,
        )
        self._model_name = model_name
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.", LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between output tokens.", LATENCY_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to last output.", LATENCY_BUCKETS)
        self.prompt_len = histogram("request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS)
        self.output_len = histogram("request_generation_tokens", "Tokens generated per request.", TOKEN_BUCKETS)
        self.http = Counter(
            metric_name(prefix, "http_requests"),
            "HTTP requests by route and status.",
            ["route", "status"],
            registry=reg,
        )

    # ---- StatLogger hooks (called on the event loop) -----------------------------------
    def on_tokens(self, stream: RequestStream, num_new_tokens: int, now: float) -> None:
        if stream.first_token_time is None:
            self.ttft.observe(now - stream.arrival_time)
            self.prompt_tokens.inc(len(stream.prompt_token_ids))
        else:
            gap = now - (stream.last_token_time or now)
            for _ in range(num_new_tokens):
                self.itl.observe(gap / num_new_tokens)
        self.generation_tokens.inc(num_new_tokens)

    def on_finished(self, stream: RequestStream, finish_reason: str, now: float) -> None:
        self._finished.labels(self._model_name, finish_reason).inc()
        self.e2e.observe(now - stream.arrival_time)
        self.prompt_len.observe(len(stream.prompt_token_ids))
        self.output_len.observe(stream.num_generation_tokens)

    def record_http(self, route: str, status: int) -> None:
        self.http.labels(route, str(status)).inc()

    def render(self, stats: SchedulerStats | None) -> bytes:
        if stats is not None:
            self.engine.stats = stats
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """Gauges read from the engine's latest SchedulerStats at scrape time."""

    def __init__(self, model_name: str, prefix: str) -> None:
        self.model_name = model_name
        self.prefix = prefix
        self.stats = SchedulerStats()

    def collect(self):
        s, name = self.stats, self.model_name
        gauges = {
            "num_requests_running": ("Requests in the running batch.", s.num_running),
            "num_requests_waiting": ("Requests waiting to be scheduled.", s.num_waiting),
            "kv_cache_usage_perc": ("Fraction of KV-cache blocks in use (0-1).", s.kv_cache_usage),
            "kv_cache_free_blocks": ("Free KV-cache blocks.", s.num_free_blocks),
            "kv_cache_total_blocks": ("KV-cache blocks in all.", s.num_blocks),
            "prefix_cache_hit_rate": (
                "Prompt tokens found in the prefix cache / prompt tokens looked up (NaN until the engine reports it).",
                prefix_hit_rate(s),
            ),
        }
        for metric, (doc, value) in gauges.items():
            g = GaugeMetricFamily(metric_name(self.prefix, metric), doc, labels=["model_name"])
            g.add_metric([name], float(value))
            yield g
        counters = {
            "num_preemptions": ("Preemptions since start.", s.num_preemptions),
            "prefix_cache_queries": ("Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries),
            "prefix_cache_hits": ("Of those, tokens found in the prefix cache.", s.prefix_cache_hits),
            "external_prefix_cache_queries": (
                "Prompt tokens looked up through the KV connector past the device's prefix-cache hits.",
                s.external_prefix_cache_queries,
            ),
            "external_prefix_cache_hits": (
                "Of those, tokens loaded through the KV connector (host memory, shared storage).",
                s.external_prefix_cache_hits,
            ),
            "spec_decode_num_drafts": ("Speculative verification steps with drafts.", s.spec_num_drafts),
            "spec_decode_num_draft_tokens": ("Draft tokens proposed.", s.spec_num_draft_tokens),
            "spec_decode_num_accepted_tokens": ("Draft tokens accepted.", s.spec_num_accepted_tokens),
        }
        for metric, (doc, value) in counters.items():
            c = CounterMetricFamily(metric_name(self.prefix, metric), doc, labels=["model_name"])
            c.add_metric([name], float(value))
            yield c


def prefix_hit_rate(stats: SchedulerStats) -> float:
    """From vLLM-style ``prefix_cache_hits``/``prefix_cache_queries`` (tokens) or a
    ready ``prefix_cache_hit_rate``; NaN when the scheduler reports neither."""
    hits, queries = getattr(stats, "prefix_cache_hits", None), getattr(stats, "prefix_cache_queries", None)
    if hits is not None and queries is not None:
        return hits / queries if queries else 0.0
    rate = getattr(stats, "prefix_cache_hit_rate", None)
    return float(rate) if rate is not None else math.nan
