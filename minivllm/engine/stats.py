"""Live engine stats: one snapshot dataclass and the periodic log line.

Every ``scheduler.log_stats_interval`` seconds (0 turns it off) the engine logs
one line in the spirit of vLLM's::

    Avg prompt throughput: 812.4 tokens/s, Avg generation throughput: 95.1 tokens/s, Running: 12 reqs,
    Waiting: 40 reqs, Preempted: 2 reqs, KV cache usage: 87.5%, Prefix cache hit rate: 61.3%

With speculative decoding on, the line ends with its acceptance rate, mean
accepted length (tokens per verification step, the target's own included) and
drafts per second over the window.

Throughputs are averaged over the window since the previous line. Prompt
tokens count when a request gets its first output token (its whole prompt,
cached part included, as vLLM counts them). ``LLMEngine.get_stats()`` returns
the same numbers as an ``EngineStats`` without closing the window.

``LLM.get_metrics()`` gives the engine's counters and gauges as vLLM's metric
records (``engine_metrics``): vLLM returns Prometheus samples (``Counter``,
``Gauge``) named ``vllm:*``; these are the same names, under
``serve.metrics_prefix`` as the server's /metrics are, read from the engine's own
totals (no Prometheus registry).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from minivllm.config.task import metric_name
from minivllm.core.stats import SchedulerStats, SpecDecodingStats

logger = logging.getLogger(__name__)


@dataclass
class EngineStats:
    prompt_throughput: float
    """Prompt tokens per second over the current window."""
    generation_throughput: float
    """Generated tokens per second over the current window."""
    num_running: int
    num_waiting: int
    num_preempted: int
    """Waiting requests that were preempted and wait to resume."""
    kv_cache_usage: float
    """Fraction of KV blocks held by requests, in [0, 1]."""
    prefix_cache_hit_rate: float
    """Prompt tokens found in the prefix cache / tokens looked up, since the start."""
    num_preemptions: int
    """Preemptions since the start."""
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_prompt_tokens: int
    """Prompt tokens since the start."""
    num_generation_tokens: int
    """Generated tokens since the start."""
    window_s: float
    """Length of the window the throughputs average over."""
    spec_decoding: SpecDecodingStats | None = None
    """Speculative decoding counters since the start; None when it is off."""
    spec_drafts_per_s: float = 0.0
    """Verification steps with drafts per second over the current window."""
    external_prefix_cache_queries: int = 0
    """With a KV connector: prompt tokens looked up past the device's hits since the start."""
    external_prefix_cache_hits: int = 0
    """Of those, tokens loaded through the connector (host memory, shared storage)."""

    def format(self) -> str:
        return (
            f"Avg prompt throughput: {self.prompt_throughput:.1f} tokens/s, "
            f"Avg generation throughput: {self.generation_throughput:.1f} tokens/s, "
            f"Running: {self.num_running} reqs, Waiting: {self.num_waiting} reqs, "
            f"Preempted: {self.num_preempted} reqs, KV cache usage: {100 * self.kv_cache_usage:.1f}%, "
            f"Prefix cache hit rate: {100 * self.prefix_cache_hit_rate:.1f}%"
            + (self._spec_part() if self.spec_decoding is not None else "")
        )

    def _spec_part(self) -> str:
        spec = self.spec_decoding
        return (
            f", Spec decode acceptance rate: {100 * spec.acceptance_rate:.1f}%, "
            f"Mean accepted length: {spec.mean_accepted_length:.2f}, Drafts: {self.spec_drafts_per_s:.1f}/s"
        )


class StatLogger:
    """Accumulates token counts per step and logs a line when the interval has passed."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self._window_start = clock()
        self._window_prompt = 0
        self._window_generation = 0
        self._window_drafts_start = 0

    def record_step(self, num_prompt_tokens: int, num_generation_tokens: int) -> None:
        self.num_prompt_tokens += num_prompt_tokens
        self.num_generation_tokens += num_generation_tokens
        self._window_prompt += num_prompt_tokens
        self._window_generation += num_generation_tokens

    def snapshot(self, sched: SchedulerStats) -> EngineStats:
        window = max(self._clock() - self._window_start, 1e-9)
        return EngineStats(
            prompt_throughput=self._window_prompt / window,
            generation_throughput=self._window_generation / window,
            num_running=sched.num_running,
            num_waiting=sched.num_waiting,
            num_preempted=sched.num_preempted,
            kv_cache_usage=sched.kv_cache_usage,
            prefix_cache_hit_rate=sched.prefix_cache_hit_rate,
            num_preemptions=sched.num_preemptions,
            prefix_cache_queries=sched.prefix_cache_queries,
            prefix_cache_hits=sched.prefix_cache_hits,
            num_prompt_tokens=self.num_prompt_tokens,
            num_generation_tokens=self.num_generation_tokens,
            window_s=window,
            spec_decoding=_spec_stats(sched),
            spec_drafts_per_s=(sched.spec_num_drafts - self._window_drafts_start) / window,
            external_prefix_cache_queries=sched.external_prefix_cache_queries,
            external_prefix_cache_hits=sched.external_prefix_cache_hits,
        )

    def maybe_log(self, sched_stats: Callable[[], SchedulerStats]) -> EngineStats | None:
        """Log and start a new window if the interval has passed; returns what was logged."""
        if self.interval_s <= 0 or self._clock() - self._window_start < self.interval_s:
            return None
        stats = self.snapshot(sched_stats())
        logger.info("%s", stats.format())
        self._window_start = self._clock()
        self._window_prompt = self._window_generation = 0
        self._window_drafts_start = stats.spec_decoding.num_drafts if stats.spec_decoding is not None else 0
        return stats


def _spec_stats(sched: SchedulerStats) -> SpecDecodingStats | None:
    if not sched.spec_decoding:
        return None
    return SpecDecodingStats(sched.spec_num_drafts, sched.spec_num_draft_tokens, sched.spec_num_accepted_tokens)


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
        Counter(name("external_prefix_cache_queries"), dict(labels), stats.external_prefix_cache_queries),
        Counter(name("external_prefix_cache_hits"), dict(labels), stats.external_prefix_cache_hits),
    ]
