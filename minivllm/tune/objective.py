"""What a trial is worth: throughput under latency targets, as one number for the sweeper.

A trial that meets every target scores its output tokens/s (> 0). One that misses
scores ``-miss``, the sum over targets of how far past each it landed, relative to
the target (p99 TTFT at 150 ms against 100 ms misses by 0.5): below every feasible
trial, and less bad the closer it came, so the sampler moves toward the feasible
region. A trial whose engine did not start or crashed (a bad combination, no room
for the KV cache, out of memory) is a failed trial: its reason is in the job's
metrics.json and the trials table, and it scores ``FAILED_SCORE``, below every trial
that ran, so the sampler learns to avoid its region too (a trial the sweeper itself
marks failed teaches TPE nothing), and the sweep goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

from minivllm.config.task import SloConfig

logger = logging.getLogger("minivllm")

THROUGHPUT = "output_tokens_per_s"
FAILED_SCORE = -1e6
"""The score of a failed trial: below any miss of the targets that a trial which ran could score."""


@dataclass(frozen=True)
class Verdict:
    """A finished job measured against the targets."""

    ok: bool
    """The engine ran the workload (False: failed to start or crashed)."""
    feasible: bool
    """Every latency target met."""
    miss: float
    """Sum of (p99 / target - 1) over the targets missed; 0 when feasible."""
    score: float | None
    """What the sweeper maximizes (None: a failed trial)."""


def judge(metrics: Mapping[str, Any], slo: SloConfig) -> Verdict:
    """Score one job's metrics against ``slo``."""
    if metrics.get("status", "ok") != "ok" or metrics.get(THROUGHPUT) is None:
        return Verdict(ok=False, feasible=False, miss=float("inf"), score=None)
    miss = 0.0
    for key, target in slo.targets().items():
        if metrics.get(key) is None:
            raise ValueError(f"tune.slo.{key}: the job's metrics have no {key}; tune with bench=serving")
        miss += max(0.0, metrics[key] / target - 1.0)
    feasible = miss == 0.0
    return Verdict(ok=True, feasible=feasible, miss=miss, score=metrics[THROUGHPUT] if feasible else -miss)


def sweeper_value(metrics: Mapping[str, Any], slo: SloConfig, job: str) -> float:
    """The job's return value for the Optuna sweeper: its score (``FAILED_SCORE`` when it failed)."""
    verdict = judge(metrics, slo)
    if not verdict.ok:
        logger.warning("job %s failed (the sweep goes on): %s", job, metrics.get("error", "no metrics"))
        return FAILED_SCORE
    logger.info(
        "job %s: %.1f output tok/s, p99 TTFT %.1f ms, ITL %.1f ms, E2E %.1f ms -> %s, score %.4g",
        job,
        metrics[THROUGHPUT],
        metrics.get("ttft_p99_ms", float("nan")),
        metrics.get("itl_p99_ms", float("nan")),
        metrics.get("e2e_p99_ms", float("nan")),
        "meets the targets" if verdict.feasible else f"misses the targets by {verdict.miss:.0%}",
        verdict.score,
    )
    return verdict.score
