"""Hydra multirun support: a failed job is recorded, not fatal; the sweep ends in a summary.

    python -m minivllm -m task=bench cache.gpu_memory_utilization=0.3,0.6,0.9 cache.block_size=8,16,32

Hydra's basic sweeper re-raises a job's exception and abandons the sweep, so the
CLI runs each multirun job through ``run_sweep_job``, which writes the error
into the job's metrics.json instead. ``SweepSummaryCallback`` (registered in
``conf/config.yaml`` under ``hydra.callbacks``) then writes summary.csv and
summary.png into the sweep folder and prints the table.
"""

from __future__ import annotations

import json
import logging
import traceback
from pathlib import Path
from typing import Any, Callable

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from minivllm.bench.summary import write_summary

logger = logging.getLogger("minivllm")


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
