"""The tuning objective and the choice of the best trial, on synthetic trial results."""

from __future__ import annotations

import random

import pytest

from minivllm.config.task import SloConfig
from minivllm.tune.objective import FAILED_SCORE, judge, sweeper_value
from minivllm.tune.report import pareto_front, select_best


def _metrics(tok_s: float, ttft: float, itl: float) -> dict:
    return {"status": "ok", "output_tokens_per_s": tok_s, "ttft_p99_ms": ttft, "itl_p99_ms": itl, "e2e_p99_ms": 1.0}


def _row(trial: int, metrics: dict, slo: SloConfig) -> dict:
    verdict = judge(metrics, slo)
    return {
        "trial": trial,
        **metrics,
        "feasible": verdict.feasible,
        "slo_miss": verdict.miss if verdict.ok else None,
    }


def test_feasible_trials_score_their_throughput_and_infeasible_ones_how_far_they_miss():
    slo = SloConfig(ttft_p99_ms=100.0, itl_p99_ms=20.0)
    assert judge(_metrics(500.0, 100.0, 20.0), slo).score == 500.0  # on the target counts as meeting it
    near, far = judge(_metrics(900.0, 150.0, 20.0), slo), judge(_metrics(900.0, 300.0, 30.0), slo)
    assert not near.feasible and near.miss == pytest.approx(0.5) and near.score == pytest.approx(-0.5)
    assert far.miss == pytest.approx(2.0 + 0.5)  # the misses of both targets add up
    assert far.score < near.score < 0 < judge(_metrics(1.0, 1.0, 1.0), slo).score
    assert judge(_metrics(900.0, 10_000.0, 10_000.0), SloConfig()).score == 900.0  # no targets: throughput


def test_a_failed_trial_scores_below_every_trial_that_ran():
    failed = {"status": "failed", "error": "ValueError: cache.gpu_memory_utilization=0.0001: leaves no room"}
    assert judge(failed, SloConfig()).score is None and not judge(failed, SloConfig()).ok
    slo = SloConfig(ttft_p99_ms=1.0, itl_p99_ms=1.0, e2e_p99_ms=1.0)
    worst_miss = sweeper_value(_metrics(1.0, 1e5, 1e5), slo, "0")  # 100,000 times over two targets
    assert sweeper_value(failed, slo, "1") == FAILED_SCORE < worst_miss < 0


def test_latency_targets_need_the_serving_metrics():
    with pytest.raises(ValueError, match="tune.slo.itl_p99_ms"):
        judge({"status": "ok", "output_tokens_per_s": 10.0}, SloConfig(itl_p99_ms=5.0))
    with pytest.raises(ValueError, match="tune.slo.ttft_p99_ms"):
        SloConfig(ttft_p99_ms=0.0)


def test_the_best_is_the_fastest_feasible_trial_never_an_infeasible_one():
    rng = random.Random(0)
    slo = SloConfig(ttft_p99_ms=100.0, itl_p99_ms=20.0)
    for _ in range(200):
        rows = [
            _row(i, _metrics(rng.uniform(10, 1000), rng.uniform(50, 200), rng.uniform(5, 40)), slo) for i in range(12)
        ]
        rows.append({"trial": 12, "status": "failed", "output_tokens_per_s": None, "feasible": False, "slo_miss": None})
        best = select_best(rows)
        feasible = [r for r in rows if r.get("ttft_p99_ms", 1e9) <= 100.0 and r.get("itl_p99_ms", 1e9) <= 20.0]
        if feasible:
            assert best["feasible"] and best["ttft_p99_ms"] <= 100.0 and best["itl_p99_ms"] <= 20.0
            assert best["output_tokens_per_s"] == max(r["output_tokens_per_s"] for r in feasible)
        else:  # none meets the targets: the closest miss is offered (and flagged infeasible)
            assert not best["feasible"]
            assert best["slo_miss"] == min(r["slo_miss"] for r in rows if r["slo_miss"] is not None)


def test_no_trial_ran():
    assert select_best([{"trial": 0, "output_tokens_per_s": None, "feasible": False, "slo_miss": None}]) is None


def test_pareto_front_keeps_the_points_no_other_beats_on_both_axes():
    rng = random.Random(1)
    points = [(rng.uniform(0, 100), rng.uniform(0, 100)) for _ in range(60)]
    front = pareto_front(points)
    dominated = [p for p in points if any(q[0] <= p[0] and q[1] >= p[1] and q != p for q in points)]
    assert sorted(front) == sorted(set(points) - set(dominated))
