"""One engine per process, started by an external launcher (``parallel.backend=external_launcher``).

As vLLM's ``ExecutorWithExternalLauncher`` does for RL frameworks: the user
starts ``world_size`` processes themselves (``torchrun --nproc-per-node N
script.py``), and every process runs the same script with the same prompts and
seeds. Each process builds a whole engine (scheduler, KV-cache manager) around
one local Worker, whose rank and rendezvous come from the launcher's
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``)::

    torchrun ──> process 0: LLM ─ EngineCore ─ Scheduler ─ Worker(rank 0) ─┐ gloo / NCCL
            └──> process 1: LLM ─ EngineCore ─ Scheduler ─ Worker(rank 1) ─┘ (tp collectives)

The schedulers never talk to each other: fed the same requests, they make the
same decisions step by step, and every rank samples the same tokens (the
logits are gathered on every rank; seeded sampling draws the same numbers), so
the ranks stay in lockstep. The one value that could differ, the number of KV
blocks that fit, is agreed on with an all-reduce (the minimum). Every process
gets the outputs; by convention rank 0 reports them.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import torch
import torch.distributed as dist

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.executor.base import Executor, run_method
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.outputs import ModelRunnerOutput
from minivllm.worker.extension import build_worker

LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launcher_rank(world_size: int) -> int:
    """This process's rank from the launcher's environment; ValueError when it
    is missing or disagrees with the config's world size."""
    missing = [key for key in LAUNCHER_ENV if key not in os.environ]
    if missing:
        raise ValueError(
            f"parallel.backend=external_launcher: {', '.join(missing)} not set; start every process with "
            f"torchrun (torchrun --nproc-per-node {world_size} script.py), or use parallel.backend=mp"
        )
    launched = int(os.environ["WORLD_SIZE"])
    if launched != world_size:
        raise ValueError(
            f"parallel.backend=external_launcher: the launcher started WORLD_SIZE={launched} processes, but "
            f"parallel.tp x parallel.pp = {world_size}; make them equal"
        )
    return int(os.environ["RANK"])


class ExecutorWithExternalLauncher(Executor):
    def __init__(self, cfg: VllmConfig) -> None:
        super().__init__(cfg)
        self.rank = launcher_rank(cfg.world_size)
        self.worker = build_worker(cfg, rank=self.rank, distributed_init_method="env://")
        self.worker.reports_output = True  # every rank's own scheduler advances with the sampled tokens
        try:
            self.worker.init_device()
            self.worker.load_model()
        except BaseException:
            self.shutdown()
            raise

    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        """This process's rank only: every other rank runs its own copy of the call (vLLM does the same)."""
        return [run_method(self.worker, method, args, kwargs)]

    def determine_kv_cache_spec(self) -> KVCacheSpec:
        """This rank's spec with the minimum block count over the ranks, so that every scheduler
        plans with the same cache (the ranks hold the same layers: one pipeline stage, one window)."""
        local = self.worker.determine_kv_cache_spec()
        if self.cfg.world_size == 1:
            return local
        blocks = torch.tensor([local.num_blocks], dtype=torch.int64, device=self.worker.device)
        dist.all_reduce(blocks, op=dist.ReduceOp.MIN)
        return dataclasses.replace(local, num_blocks=int(blocks.item()))

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Every rank needs the sampled tokens: its own scheduler advances with them."""
        return self.worker.execute_model(scheduler_output)

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
            self.worker = None
