"""The two pictures of a tuning run: throughput against p99 latency, and what mattered.

pareto.png: one panel per latency (TTFT, ITL, E2E p99), every trial that ran as a
point (green: meets every target, orange: misses one), the Pareto front (no other
trial is both faster and lower-latency) as a line, the target as a dashed line and
the chosen trial as a star.

importance.png: each sampled key's importance for the score, by Optuna's
mean-decrease-in-impurity evaluator (a random forest from scikit-learn, a dependency
of the ``tune`` extra). Optuna's default fANOVA evaluator is not used: in optuna
2.10 (the newest the Hydra sweeper allows) it fails on scikit-learn >= 1.4's trees.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from minivllm.tune.objective import THROUGHPUT

LATENCIES = (("ttft_p99_ms", "p99 TTFT (ms)"), ("itl_p99_ms", "p99 ITL (ms)"), ("e2e_p99_ms", "p99 E2E latency (ms)"))


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
