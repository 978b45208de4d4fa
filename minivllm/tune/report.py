"""What a tuning run leaves in its sweep folder, and how to use it: the trials as rows
(trials.csv, trials.md), the best one (best.yaml) and two pictures (pareto.png,
importance.png); ``load_tuned`` reads best.yaml back as a config.

**The trials**: the sampled keys, the job's metrics, the verdict. A trial's metrics
live in its job's ``metrics.json``; job ``k`` of a sweep is the study's trial
``first + k`` (the sweeper asks trials in order and launches them as jobs in that
order; ``first`` is the number of trials the study held when the sweep started).
``trials.jsonl`` in the sweep folder keeps every trial's metrics, so a resumed study
(whose new jobs reuse the folder names 0, 1, ...) still reports the earlier ones.

**best.yaml** is a Hydra primary config: minivllm's root config with the best trial's
engine keys on top, so it is used as it is::

    python -m minivllm --config-dir SWEEP_DIR --config-name best task=serve
    python -m minivllm --config-dir SWEEP_DIR --config-name best task=bench bench=serving
    LLM.from_config(minivllm.tune.load_tuned("SWEEP_DIR/best.yaml"))

**pareto.png**: one panel per latency (TTFT, ITL, E2E p99), every trial that ran as a
point (green: meets every target, orange: misses one), the Pareto front (no other
trial is both faster and lower-latency) as a line, the target as a dashed line and
the chosen trial as a star.

**importance.png**: each sampled key's importance for the score, by Optuna's
mean-decrease-in-impurity evaluator (a random forest from scikit-learn, a dependency
of the ``tune`` extra). Optuna's default fANOVA evaluator is not used: in optuna
2.10 (the newest the Hydra sweeper allows) it fails on scikit-learn >= 1.4's trees.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from minivllm.config.store import register_configs
from minivllm.config.task import SloConfig
from minivllm.config.vllm_config import VllmConfig
from minivllm.tune.objective import THROUGHPUT, judge

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
ENGINE_SECTIONS = (
    "model",
    "parallel",
    "cache",
    "scheduler",
    "load",
    "compilation",
    "attention",
    "device",
    "speculative",
    "lora",
)
SUMMARY_COLUMNS = ("trial", "state", "feasible", THROUGHPUT, "ttft_p99_ms", "itl_p99_ms", "e2e_p99_ms", "score")
LATENCIES = (("ttft_p99_ms", "p99 TTFT (ms)"), ("itl_p99_ms", "p99 ITL (ms)"), ("e2e_p99_ms", "p99 E2E latency (ms)"))


# ---- the trials ----------------------------------------------------------------------------


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


# ---- the tables and best.yaml ----------------------------------------------------------------


def write_tables(rows: list[dict[str, Any]], params: list[str], sweep_dir: Path) -> str:
    """trials.csv (every column) and trials.md (the keys and the headline numbers); returns the markdown."""
    columns = [k for k in dict.fromkeys(k for r in rows for k in r) if k != "config"]
    with open(sweep_dir / "trials.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    shown = ["trial", "state", *params, *SUMMARY_COLUMNS[2:]]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in shown) + " |" for r in rows]
    lines += [f"\ntrial {r['trial']} failed: {r['error']}" for r in rows if r.get("error")]
    table = "\n".join(lines) + "\n"
    (sweep_dir / "trials.md").write_text(table)
    return table


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1 else f"{value:.1f}"
    return "" if value is None else str(value)


def engine_keys(job_overrides: list[str]) -> list[str]:
    """The keys best.yaml carries: the engine keys among a job's overrides, the sampled ones
    included (a group choice such as ``model=opt-125m`` carries its whole section)."""
    keys = (item.split("=", 1)[0].lstrip("+~") for item in job_overrides)
    return list(dict.fromkeys(k for k in keys if k.split(".", 1)[0] in ENGINE_SECTIONS))


def best_config(job_config: DictConfig, keys: list[str]) -> dict[str, Any]:
    """The resolved values of ``keys`` in the best job's config, nested by section."""
    out: dict[str, Any] = {}
    for key in keys:
        value = OmegaConf.select(job_config, key)
        if isinstance(value, DictConfig):
            value = OmegaConf.to_container(value, resolve=True)
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def write_best(best: dict[str, Any], values: dict[str, Any], slo: dict[str, float], path: Path) -> None:
    """best.yaml: a header saying what the trial measured and how to use it, then the config."""
    verdict = "meets every target" if best["feasible"] else "MISSES the targets (no trial met them; the closest)"
    targets = ", ".join(f"{k} <= {v:g}" for k, v in slo.items()) or "none"
    header = [
        f"# The tuned engine config: trial {best['trial']} of the study in this folder.",
        f"# {best[THROUGHPUT]:.1f} output tok/s; p99 TTFT {best['ttft_p99_ms']:.1f} ms, "
        f"ITL {best['itl_p99_ms']:.1f} ms, E2E {best['e2e_p99_ms']:.1f} ms; {verdict} ({targets}).",
        "# Use it as Hydra's primary config (any other override still applies on top):",
        f"#   python -m minivllm --config-dir {path.parent} --config-name best task=serve",
        f"#   python -m minivllm --config-dir {path.parent} --config-name best task=bench bench=serving",
        f'#   LLM.from_config(minivllm.tune.load_tuned("{path}"))',
    ]
    body = {"defaults": ["config", "_self_"], "hydra": {"searchpath": ["pkg://minivllm.conf"]}, **values}
    path.write_text("\n".join(header) + "\n" + OmegaConf.to_yaml(OmegaConf.create(body)))


def load_tuned(path: str | Path, overrides: Sequence[str] = ()) -> VllmConfig:
    """The validated config of ``path`` (a best.yaml), with Hydra ``overrides`` on top."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"load_tuned: {path} is not a file (a tuning run writes best.yaml into its sweep folder)")
    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(path.parent), version_base="1.3"):
        cfg = compose(config_name=path.stem, overrides=list(overrides))
    return VllmConfig.from_dictconfig(cfg)


# ---- the pictures ----------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (latency, throughput) points no other point beats on both, by rising latency."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front


def plot_pareto(rows: list[dict[str, Any]], best: dict[str, Any] | None, slo: dict[str, float], path: Path) -> None:
    plt = _pyplot()
    ran = [r for r in rows if r.get(THROUGHPUT) is not None and r.get("ttft_p99_ms") is not None]
    fig, axes = plt.subplots(1, len(LATENCIES), figsize=(5 * len(LATENCIES), 4.2))
    for ax, (key, label) in zip(axes, LATENCIES):
        for feasible, color, name in ((True, "tab:green", "meets targets"), (False, "tab:orange", "misses")):
            pts = [(r[key], r[THROUGHPUT]) for r in ran if r["feasible"] == feasible]
            if pts:
                ax.scatter(*zip(*pts), color=color, label=name, zorder=3)
        front = pareto_front([(r[key], r[THROUGHPUT]) for r in ran])
        if front:
            ax.step(*zip(*front), where="post", color="gray", alpha=0.6, label="Pareto front")
        if key in slo:
            ax.axvline(slo[key], color="red", linestyle="--", label="target")
        if best is not None:
            ax.scatter([best[key]], [best[THROUGHPUT]], marker="*", s=250, color="gold", edgecolor="k", zorder=4)
        ax.set_xlabel(label)
        ax.set_ylabel("output tokens/s")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    failed = len(rows) - len(ran)
    title = f"{len(rows)} trials ({failed} failed, not shown)" + (f"; best: trial {best['trial']}" if best else "")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def param_importance(study: Any, seed: int) -> dict[str, float]:
    """Importance of each sampled key for the score, summing to 1 (needs two or more complete trials)."""
    import optuna

    evaluator = optuna.importance.MeanDecreaseImpurityImportanceEvaluator(seed=seed)
    return dict(optuna.importance.get_param_importances(study, evaluator=evaluator))


def plot_importance(importance: dict[str, float] | None, reason: str, path: Path) -> None:
    """Bars of ``importance``; without it (too few complete trials), ``reason`` in their place."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.5 * max(3, len(importance or {})) + 1))
    if importance:
        names = list(importance)[::-1]
        ax.barh(names, [importance[n] for n in names], color="tab:blue")
        ax.set_xlabel("importance for the score (mean decrease in impurity)")
    else:
        ax.text(0.5, 0.5, f"no importance: {reason}", ha="center", va="center", wrap=True)
        ax.set_axis_off()
    ax.set_title("what mattered")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
