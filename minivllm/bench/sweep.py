"""Hydra multirun support: a failed job is recorded, not fatal; the sweep ends in a summary.

    python -m minivllm -m task=bench cache.gpu_memory_utilization=0.3,0.6,0.9 cache.block_size=8,16,32

Hydra's basic sweeper re-raises a job's exception and abandons the sweep, so the
CLI runs each multirun job through ``run_sweep_job``, which writes the error
into the job's metrics.json instead. ``SweepSummaryCallback`` (registered in
``conf/config.yaml`` under ``hydra.callbacks``) then writes summary.csv and
summary.png into the sweep folder and prints the table: one row per job, from
its overrides and metrics.json::

    outputs/multirun/<date>/<time>/
        0/.hydra/overrides.yaml  0/metrics.json
        1/...
        summary.csv  summary.png          <- written here

A job that failed has ``status: failed`` and its error in metrics.json; a job
with no metrics.json at all (killed) shows as ``missing``. Both stay in the table.
"""

from __future__ import annotations

import csv
import json
import logging
import traceback
from pathlib import Path
from typing import Any, Callable

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

logger = logging.getLogger("minivllm")

METRIC_COLUMNS = (
    "status",
    "output_tokens_per_s",
    "requests_per_s",
    "input_tokens_per_s",
    "total_time_s",
    "num_kv_blocks",
    "num_preemptions",
    "peak_memory_gib",
    "speedup_output_tokens_per_s",
    "error",
)


def run_sweep_job(run: Callable[..., dict[str, Any]], cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """``run(cfg, out_dir)``; on any error, the failure goes into out_dir/metrics.json."""
    try:
        return run(cfg, out_dir)
    except Exception as err:  # noqa: BLE001 - one job's failure must not end the sweep
        message = str(err).splitlines()[0] if str(err) else ""
        failure = {"status": "failed", "error": f"{type(err).__name__}: {message}"}
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "metrics.json").write_text(json.dumps({**failure, "traceback": traceback.format_exc()}, indent=2))
        logger.error("job failed (the sweep goes on): %s", failure["error"])
        return failure


class SweepSummaryCallback(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        table = write_summary(sweep_dir)
        if table is not None:
            print(f"\n== sweep summary ({sweep_dir}/summary.csv, summary.png)\n{table}")


# ---- the summary ---------------------------------------------------------------------------


def _job_dirs(sweep_dir: Path) -> list[Path]:
    jobs = [d for d in sweep_dir.iterdir() if d.is_dir() and (d / ".hydra" / "overrides.yaml").is_file()]
    return sorted(jobs, key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name))


def _overrides(job_dir: Path) -> dict[str, str]:
    items = OmegaConf.to_container(OmegaConf.load(job_dir / ".hydra" / "overrides.yaml"))
    pairs = (str(item).split("=", 1) for item in items or [])
    return {k.lstrip("+~"): v for k, v in (p for p in pairs if len(p) == 2)}


def collect(sweep_dir: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """(swept keys, one row per job). Swept keys are the overrides whose values differ across jobs."""
    rows, all_overrides = [], []
    for job in _job_dirs(sweep_dir):
        overrides = _overrides(job)
        all_overrides.append(overrides)
        metrics_file = job / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {"status": "missing"}
        metrics.setdefault("status", "ok")
        rows.append({"job": job.name, **overrides, **{c: metrics.get(c) for c in METRIC_COLUMNS}})
    keys = list(dict.fromkeys(k for o in all_overrides for k in o))
    swept = [k for k in keys if len({o.get(k) for o in all_overrides}) > 1] or keys
    return swept, rows


def write_summary(sweep_dir: Path) -> str | None:
    """Write summary.csv and summary.png into ``sweep_dir``; returns the printed table (None: no jobs)."""
    swept, rows = collect(sweep_dir)
    if not rows:
        return None
    override_keys = list(dict.fromkeys(k for r in rows for k in r if k not in METRIC_COLUMNS and k != "job"))
    columns = ["job", *override_keys, *METRIC_COLUMNS]
    with open(sweep_dir / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows({c: r.get(c) for c in columns} for r in rows)
    plot_summary(rows, swept, sweep_dir / "summary.png")
    return format_table(rows, ["job", *swept, "status", "output_tokens_per_s", "num_preemptions", "num_kv_blocks"])


def format_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.1f}" if isinstance(v, float) else ("" if v is None else str(v))

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(line, widths)) for line in cells]
    for r in rows:
        if r.get("error"):
            lines.append(f"job {r['job']} failed: {r['error']}")
    return "\n".join(lines)


def _as_number(value: str) -> float | str:
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def plot_summary(rows: list[dict[str, Any]], swept: list[str], path: Path) -> None:
    """Output tokens/s and preemptions against the first swept key, one line per
    combination of the other swept keys; failed jobs are red crosses at zero."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_key, series_keys = (swept[0], swept[1:]) if swept else ("job", [])
    x_values = sorted({str(r.get(x_key)) for r in rows}, key=lambda v: (isinstance(_as_number(v), str), _as_number(v)))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(", ".join(f"{k}={r.get(k)}" for k in series_keys) or "all jobs", []).append(r)
    for ax, metric, title in zip(axes, ("output_tokens_per_s", "num_preemptions"), ("output tokens/s", "preemptions")):
        for label, group in groups.items():
            ok = sorted((x_values.index(str(r.get(x_key))), r[metric]) for r in group if r["status"] == "ok")
            if ok:
                ax.plot([p[0] for p in ok], [p[1] for p in ok], marker="o", label=label)
            failed = [x_values.index(str(r.get(x_key))) for r in group if r["status"] != "ok"]
            if failed:
                ax.scatter(failed, [0] * len(failed), marker="x", color="red", zorder=3)
        ax.set_xticks(range(len(x_values)), x_values)
        ax.set_xlabel(x_key)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8)
    fig.suptitle(f"{path.parent.name}: {len(rows)} jobs ({sum(r['status'] != 'ok' for r in rows)} failed, red x)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
