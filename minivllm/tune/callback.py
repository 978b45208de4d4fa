"""The tune presets' Hydra callback: the study's budget before the sweep, the answer after it.

Hydra's sweepers have no end-of-sweep hook of their own, and the Optuna sweeper
writes only ``optimization_results.yaml``; a callback (``hydra.callbacks`` in
``conf/tune/*.yaml``) runs in the process that drives the sweep, whichever
launcher runs the trials, and sees the sweep folder and the study's storage.

Before: ``tune.trials`` is the study's budget in all, so the sweeper runs only the
trials left (a resumed study), with the sampler's seed moved past the ones already
drawn (else a resumed TPE would repeat its first random trials).
After: trials.csv, trials.md, best.yaml, pareto.png and importance.png.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from minivllm.config.task import SloConfig
from minivllm.tune.report import (
    param_importance,
    plot_importance,
    plot_pareto,
    select_best,
    trial_rows,
    update_records,
    write_best,
    write_tables,
)

logger = logging.getLogger("minivllm")

FINISHED_STATES = ("COMPLETE", "FAIL", "PRUNED")


def load_study(sweeper: DictConfig) -> Any | None:
    """The sweeper's study, or None when its storage holds none yet."""
    import optuna

    if not sweeper.get("storage"):
        raise ValueError("hydra.sweeper.storage: the tune presets need a storage (sqlite:///PATH) to report from")
    try:
        return optuna.load_study(study_name=sweeper.study_name, storage=sweeper.storage)
    except KeyError:  # no study of that name yet
        return None


def _slo(config: DictConfig) -> SloConfig:
    return OmegaConf.to_object(config.tune.slo)


class TuneCallback(Callback):
    def __init__(self) -> None:
        self.first_trial = 0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra turns a callback's exception into a warning and goes on; a tuning run that
        cannot be set up (bad keys, unreadable storage) must stop here, before any trial."""
        try:
            self._prepare(config)
        except Exception as err:  # noqa: BLE001 - every cause stops the sweep with its message
            print(f"error: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
            sys.exit(2)

    def _prepare(self, config: DictConfig) -> None:
        slo = _slo(config)
        if slo.targets() and config.bench.mode != "serving":
            raise ValueError(f"tune.slo: latency targets need bench.mode=serving (not {config.bench.mode})")
        Path(config.hydra.sweep.dir).mkdir(parents=True, exist_ok=True)  # the SQLite file goes there
        sweeper = config.hydra.sweeper
        study = load_study(sweeper)
        trials = study.trials if study is not None else []
        self.first_trial = len(trials)
        finished = sum(t.state.name in FINISHED_STATES for t in trials)
        left = max(0, config.tune.trials - finished)
        with read_write(sweeper), open_dict(sweeper):
            sweeper.n_trials = left
            if "seed" in sweeper.sampler:
                sweeper.sampler.seed = config.tune.seed + len(trials)
        if trials:
            logger.info(
                "study %s: %d trials already run, %d of tune.trials=%d left",
                sweeper.study_name,
                finished,
                left,
                config.tune.trials,
            )

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        study = load_study(config.hydra.sweeper)
        if study is None:
            return
        slo = _slo(config)
        records = update_records(sweep_dir, self.first_trial, len(study.trials) - self.first_trial)
        rows = trial_rows(study.trials, records, slo)
        params = list(dict.fromkeys(k for t in study.trials for k in t.params))
        table = write_tables(rows, params, sweep_dir)
        best = select_best(rows)
        if best is not None:
            write_best(best, best["config"] or {}, slo.targets(), sweep_dir / "best.yaml")
        plot_pareto(rows, best, slo.targets(), sweep_dir / "pareto.png")
        self._plot_importance(study, config.tune.seed, sweep_dir / "importance.png")
        print(f"\n== tuning: {len(rows)} trials (trials.csv, trials.md, pareto.png, importance.png in {sweep_dir})")
        print(table)
        print(_verdict(best, sweep_dir))

    @staticmethod
    def _plot_importance(study: Any, seed: int, path: Path) -> None:
        complete = [t for t in study.trials if t.state.name == "COMPLETE"]
        importance, reason = None, ""
        try:
            importance = param_importance(study, seed) if len(complete) >= 2 else None
            reason = f"{len(complete)} complete trial(s); it needs two or more"
        except (ValueError, RuntimeError) as err:  # e.g. no key varied across the complete trials
            reason = str(err).splitlines()[0]
        plot_importance(importance, reason, path)


def _verdict(best: dict[str, Any] | None, sweep_dir: Path) -> str:
    if best is None:
        return "no trial ran the workload: no best.yaml (see the errors above)"
    if not best["feasible"]:
        return (
            f"WARNING: no trial met the latency targets; {sweep_dir / 'best.yaml'} holds the closest "
            f"(trial {best['trial']}, {best['slo_miss']:.0%} over)"
        )
    return f"best: trial {best['trial']}, {best['output_tokens_per_s']:.1f} output tok/s -> {sweep_dir / 'best.yaml'}"
