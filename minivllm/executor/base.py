"""The executor interface the engine core talks to.

Every call fans out to all workers through ``collective_rpc``; only rank 0's
``execute_model`` result is returned (the ranks agree on sampled tokens).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import ModelRunnerOutput, SchedulerOutput


class Executor(ABC):
    def __init__(self, cfg: VllmConfig) -> None:
        self.cfg = cfg

    @abstractmethod
    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        """Call ``method`` on every worker; results in rank order."""

    def determine_num_available_blocks(self) -> int:
        return min(self.collective_rpc("determine_num_available_blocks"))

    def initialize_cache(self, num_blocks: int) -> None:
        self.collective_rpc("initialize_cache", (num_blocks,))

    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        return self.collective_rpc("execute_model", (sched,))[0]

    def shutdown(self) -> None:
        """Release workers and processes; safe to call more than once."""
