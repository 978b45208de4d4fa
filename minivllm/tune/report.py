"""What a tuning run leaves in its sweep folder: trials.csv, trials.md and best.yaml.

best.yaml is a Hydra primary config: minivllm's root config with the best trial's
engine keys on top, so it is used as it is::

    python -m minivllm --config-dir SWEEP_DIR --config-name best task=serve
    python -m minivllm --config-dir SWEEP_DIR --config-name best task=bench bench=serving
    LLM.from_config(minivllm.tune.load_tuned("SWEEP_DIR/best.yaml"))
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from minivllm.tune.objective import THROUGHPUT

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
