"""Schema of the ``tune`` group: what ``+tune=serving`` (or ``+tune=grid``) optimizes.

The search space and the sweeper are Hydra's (``conf/tune/*.yaml`` set
``hydra.sweeper``); these keys say what a trial is worth: output tokens/s, as long
as every latency target is met (minivllm/tune/objective.py scores the others below
every feasible trial, by how far they miss).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from minivllm.config.validation import check_range

SLO_KEYS = ("ttft_p99_ms", "itl_p99_ms", "e2e_p99_ms")


@dataclass
class SloConfig:
    """Latency targets in milliseconds (null: no target)."""

    ttft_p99_ms: Optional[float] = None
    """99th percentile of time to first token (arrival -> first token)."""
    itl_p99_ms: Optional[float] = None
    """99th percentile of the gaps between tokens of one request."""
    e2e_p99_ms: Optional[float] = None
    """99th percentile of end-to-end latency (arrival -> last token)."""

    def __post_init__(self) -> None:
        for key in SLO_KEYS:
            if getattr(self, key) is not None:
                check_range(f"tune.slo.{key}", getattr(self, key), low=0.0, low_open=True)

    def targets(self) -> dict[str, float]:
        """The targets that are set, by metric name."""
        return {key: getattr(self, key) for key in SLO_KEYS if getattr(self, key) is not None}


@dataclass
class TuneConfig:
    """Auto-tuning of the engine's keys for a workload (docs/tuning.md)."""

    enabled: bool = False
    """Set by the tune presets: each multirun job returns its score to the sweeper."""
    trials: int = 20
    """Trials of the study in all; a resumed study runs the ones left."""
    seed: int = 0
    """Seed of the sampler (offset by the trials already run when a study resumes)."""
    slo: SloConfig = field(default_factory=SloConfig)
    """Latency targets every chosen config must meet."""
    devices: int = 0
    """Parallel trials on one machine: each launcher worker claims one of GPUs 0..devices-1 (0: no claim)."""

    def __post_init__(self) -> None:
        check_range("tune.trials", self.trials, low=1)
        check_range("tune.devices", self.devices, low=0)
