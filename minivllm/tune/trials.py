"""The trials of a study as rows: the sampled keys, the job's metrics, the verdict.

A trial's metrics live in its job's ``metrics.json``; job ``k`` of a sweep is the
study's trial ``first + k`` (the sweeper asks trials in order and launches them as
jobs in that order; ``first`` is the number of trials the study held when the sweep
started). ``trials.jsonl`` in the sweep folder keeps every trial's metrics, so a
resumed study (whose new jobs reuse the folder names 0, 1, ...) still reports the
earlier ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from minivllm.config.task import SloConfig
from minivllm.tune.objective import THROUGHPUT, judge
from minivllm.tune.report import best_config, engine_keys

RECORD_FILE = "trials.jsonl"
METRICS = (
    THROUGHPUT,
    "requests_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "num_kv_blocks",
    "num_preemptions",
)


def _job_record(trial: int, job_dir: Path) -> dict[str, Any]:
    metrics_file = job_dir / "metrics.json"
    if not metrics_file.is_file():
        return {"trial": trial, "job": job_dir.name, "status": "missing", "error": "no metrics.json (job stopped)"}
    metrics = json.loads(metrics_file.read_text())
    overrides = OmegaConf.to_container(OmegaConf.load(job_dir / ".hydra" / "overrides.yaml"))
    job_config = OmegaConf.load(job_dir / ".hydra" / "config.yaml")
    return {
        "trial": trial,
        "job": job_dir.name,
        "status": metrics.get("status", "ok"),
        **{key: metrics.get(key) for key in METRICS},
        "error": metrics.get("error"),
        "config": best_config(job_config, engine_keys([str(o) for o in overrides or []])),
    }


def update_records(sweep_dir: Path, first_trial: int, num_jobs: int) -> dict[int, dict[str, Any]]:
    """Every trial's record by number: the saved ones, updated with this sweep's ``num_jobs`` jobs."""
    path = sweep_dir / RECORD_FILE
    records = {}
    if path.is_file():
        records = {r["trial"]: r for r in map(json.loads, path.read_text().splitlines()) if r}
    for k in range(num_jobs):
        records[first_trial + k] = _job_record(first_trial + k, sweep_dir / str(k))
    path.write_text("".join(json.dumps(records[n]) + "\n" for n in sorted(records)))
    return records


def trial_rows(trials: list[Any], records: dict[int, dict[str, Any]], slo: SloConfig) -> list[dict[str, Any]]:
    """One row per Optuna trial (``FrozenTrial``): number, state, sampled keys, metrics, verdict."""
    rows = []
    for trial in trials:
        record = records.get(trial.number, {"status": "missing", "error": "no record of this trial's job"})
        verdict = judge(record, slo)
        rows.append(
            {
                "trial": trial.number,
                "state": _state(trial.state.name, record),
                **trial.params,
                **{key: record.get(key) for key in METRICS},
                "feasible": verdict.feasible,
                "slo_miss": None if not verdict.ok else round(verdict.miss, 4),
                "score": trial.value,
                "error": record.get("error"),
                "config": record.get("config"),
            }
        )
    return rows


def _state(optuna_state: str, record: dict[str, Any]) -> str:
    """complete; failed (the job ran and failed, or the sweeper marked it); stopped (never finished)."""
    if optuna_state == "RUNNING":
        return "stopped"
    if optuna_state == "FAIL" or record.get("status", "ok") != "ok":
        return "failed"
    return optuna_state.lower()


def select_best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The feasible trial with the most output tokens/s; without one, the trial that came
    closest to the targets (the caller says so). None: no trial ran."""
    ran = [r for r in rows if r.get(THROUGHPUT) is not None and r.get("slo_miss") is not None]
    feasible = [r for r in ran if r["feasible"]]
    if feasible:
        return max(feasible, key=lambda r: (r[THROUGHPUT], -r["trial"]))
    return min(ran, key=lambda r: (r["slo_miss"], -r[THROUGHPUT], r["trial"])) if ran else None
