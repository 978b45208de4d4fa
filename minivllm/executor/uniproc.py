"""One worker in the engine's own process (tp=1)."""

from __future__ import annotations

from typing import Any, Callable

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.executor.base import Executor, run_method
from minivllm.outputs import StepResult
from minivllm.worker.extension import build_worker


class UniProcExecutor(Executor):
    def __init__(self, cfg: VllmConfig) -> None:
        super().__init__(cfg)
        self.worker = build_worker(cfg, rank=0)
        self.worker.init_device()
        self.worker.load_model()

    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        return [run_method(self.worker, method, args, kwargs)]

    def execute_model_async(self, sched: SchedulerOutput) -> StepResult:
        return self.worker.execute_model_async(sched)  # rank 0: the output rank

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
            self.worker = None
