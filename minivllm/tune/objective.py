"""The objective: what each trial job of a tuning sweep does for the sweeper, in the
process that runs it. It claims its device (``claim_device``), runs, and returns its
score (``sweeper_value``); after a failure it frees what the trial held (``release_memory``).

**The score**: throughput under latency targets, as one number for the sweeper.
A trial that meets every target scores its output tokens/s (> 0). One that misses
scores ``-miss``, the sum over targets of how far past each it landed, relative to
the target (p99 TTFT at 150 ms against 100 ms misses by 0.5): below every feasible
trial, and less bad the closer it came, so the sampler moves toward the feasible
region. A trial whose engine did not start or crashed (a bad combination, no room
for the KV cache, out of memory) is a failed trial: its reason is in the job's
metrics.json and the trials table, and it scores ``FAILED_SCORE``, below every trial
that ran, so the sampler learns to avoid its region too (a trial the sweeper itself
marks failed teaches TPE nothing), and the sweep goes on.

**One GPU per trial** when a parallel launcher runs several trials on one machine::

    python -m minivllm -m +tune=serving hydra/launcher=joblib hydra.launcher.n_jobs=4 \\
        hydra.sweeper.n_jobs=4 tune.devices=4

With ``tune.devices=N`` the first trial in each worker process claims one of the
devices 0..N-1 (an exclusive lock on a file per device in the sweep folder, held
for the life of the process) and narrows ``CUDA_VISIBLE_DEVICES`` to it, so its
engine, and every later trial in that process, sees only that device. The variable
must be set before the process first touches CUDA: true of the joblib launcher's
fresh worker processes; the basic launcher runs trials one by one in the main
process and needs no claim.
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Mapping

from minivllm.config.task import SloConfig

logger = logging.getLogger("minivllm")

THROUGHPUT = "output_tokens_per_s"
FAILED_SCORE = -1e6
"""The score of a failed trial: below any miss of the targets that a trial which ran could score."""

_claim: tuple[int, IO] | None = None
"""This process's device: (its index, the lock file held for the life of the process)."""


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


# ---- the device of a trial process ------------------------------------------------------------


def claim_device(count: int, lock_dir: Path) -> int:
    """This process's device index among ``count`` (claimed once, then kept)."""
    global _claim
    if _claim is not None:
        return _claim[0]
    lock_dir.mkdir(parents=True, exist_ok=True)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(count)]
    if len(ids) < count:
        raise ValueError(f"tune.devices={count}: CUDA_VISIBLE_DEVICES={visible} names only {len(ids)} devices")
    for index in range(count):
        handle = open(lock_dir / f"device{index}.lock", "w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        _claim = (index, handle)
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[index]
        return index
    raise RuntimeError(
        f"tune.devices={count}: every device is taken by another trial process; "
        "run at most tune.devices trials at once (hydra.launcher.n_jobs)"
    )


def release_memory() -> None:
    """After a trial failed (out of memory, a half-built engine): free what its objects held, so
    that the next trial in this process finds the device's memory as the first one did."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
