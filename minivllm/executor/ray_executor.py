"""Tensor-parallel workers as Ray actors (``parallel.backend=ray``), so ranks can sit on several machines.

Ray is an optional extra (``pip install 'minivllm[ray]'``). The executor joins
the Ray instance already running in the process, else the cluster named by
``RAY_ADDRESS``, else starts a local one. It reserves one bundle per rank in a
placement group (``{"GPU": 1}`` on CUDA, ``{"CPU": 1}`` on the CPU) placed with
``parallel.placement_strategy`` (PACK, as vLLM: as few nodes as possible;
STRICT_SPREAD: a node per rank), failing clearly when the cluster cannot hold it
(``ray_cluster.reserve``). Actor ``i`` takes bundle ``i`` and builds one
``Worker``; the ranks rendezvous at rank 0's node. A call reaches all actors at once (``execute_model_async``
returns before the step's output is there: each actor runs its calls in the
order sent, so several steps may be in flight); as in ``MultiprocExecutor``,
the first rank to die or raise stops every actor and raises
``WorkerFailedError`` naming it and its node (a lost node kills its actors, so
its ranks are reported dead within seconds, while their peers' collectives fail).
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections import Counter
from typing import Any, Callable

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.distributed.utils import get_open_port, threads_per_rank
from minivllm.executor.base import PendingStep, ProcessExecutor, run_method
from minivllm.executor.ray_cluster import RayInstance, first_line, import_ray, node_of_this_process, reserve
from minivllm.worker.extension import build_worker

logger = logging.getLogger(__name__)


class RayWorkerWrapper:
    """The body of one Ray actor: builds its Worker once the rendezvous address is known."""

    def __init__(self, cfg: VllmConfig, rank: int) -> None:
        self.cfg, self.rank = cfg, rank
        self.worker: Any = None

    def describe(self) -> tuple[str, str, int]:
        """(Ray node id, node IP, process id) of this actor."""
        return (*node_of_this_process(), os.getpid())

    def open_port(self) -> int:
        return get_open_port()

    def build_worker(self, init_method: str, num_local_ranks: int) -> None:
        self.worker = build_worker(
            self.cfg,
            rank=self.rank,
            distributed_init_method=init_method,
            num_threads=threads_per_rank(num_local_ranks),
        )

    def execute_method(self, call: tuple[str | Callable, tuple, dict | None]) -> Any:
        method, args, kwargs = call
        return run_method(self.worker, method, args, kwargs)


class RayDistributedExecutor(ProcessExecutor):
    failure_grace_s = 2.0
    """After a rank raises, how long to watch for another rank's death (the likelier cause)."""

    def __init__(self, cfg: VllmConfig) -> None:
        super().__init__(cfg)
        self.ray = import_ray()
        self.world_size = cfg.world_size
        self._actors: list[Any] = []
        self._pids: list[int] = []
        self._nodes: list[tuple[str, str]] = []
        """(node id, IP) of each rank's actor."""
        self._failure: str | None = None
        RayInstance.acquire(self.ray)
        try:
            bundle = {"GPU": 1.0} if cfg.device_type == "cuda" else {"CPU": 1.0}
            par = cfg.parallel
            what = f"parallel.backend=ray with parallel.tp={par.tp} x parallel.pp={par.pp}"
            self._placement = reserve(
                self.ray, bundle, self.world_size, par.placement_strategy, par.placement_timeout_s, what
            )
        except BaseException:
            RayInstance.release(self.ray)
            raise
        self._finalizer = weakref.finalize(self, _release, self.ray, self._actors, self._placement)
        self._start_and_load(on_error=self.shutdown)

    @property
    def worker_pids(self) -> list[int]:
        return list(self._pids)

    @property
    def worker_node_ids(self) -> list[str]:
        """The Ray node id of each rank's actor, in rank order."""
        return [node_id for node_id, _ in self._nodes]

    def _start_workers(self) -> None:
        ray, cuda = self.ray, self.cfg.device_type == "cuda"
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor_cls = ray.remote(RayWorkerWrapper)
        self._failure = None
        for rank in range(self.world_size):
            strategy = PlacementGroupSchedulingStrategy(self._placement, placement_group_bundle_index=rank)
            options = {"num_gpus": 1, "num_cpus": 0} if cuda else {"num_cpus": 1}
            actor = actor_cls.options(scheduling_strategy=strategy, max_restarts=0, **options)
            self._actors.append(actor.remote(self.cfg, rank))
        described = self._call_each([a.describe.remote() for a in self._actors], "start-up")
        self._nodes = [(node_id, ip) for node_id, ip, _ in described]
        self._pids = [pid for _, _, pid in described]
        per_host = Counter(ip for _, ip in self._nodes)  # ranks sharing a machine's cores (Ray nodes may share one)
        port = self._call_each([self._actors[0].open_port.remote()], "start-up")[0]
        init_method = f"tcp://{self._nodes[0][1]}:{port}"
        builds = [a.build_worker.remote(init_method, per_host[ip]) for a, (_, ip) in zip(self._actors, self._nodes)]
        self._call_each(builds, "start-up")
        num_nodes = len({node_id for node_id, _ in self._nodes})
        logger.info("started %d Ray workers on %d node(s), rendezvous %s", self.world_size, num_nodes, init_method)
        self.collective_rpc("init_device")

    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        what = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
        return self._call_each(self._send(method, args, kwargs, what), what)

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> PendingStep:
        """Send the step to every actor and return at once."""
        refs, rank = (
            self._send("execute_model", (scheduler_output,), None, "execute_model"),
            self.cfg.parallel.output_rank,
        )
        return PendingStep(lambda: self._call_each(refs, "execute_model")[rank])

    def _send(self, method: str | Callable, args: tuple, kwargs: dict | None, what: str) -> list[Any]:
        """One call to every actor; the result refs in rank order."""
        if self._failure is not None:
            raise RuntimeError(f"the executor has failed and cannot run {what}: {self._failure}")
        if not self._actors:
            raise RuntimeError(f"the executor is shut down; cannot run {what}")
        call = self.ray.put((method, args, kwargs))
        return [a.execute_method.remote(call) for a in self._actors]

    def _call_each(self, refs: list[Any], what: str) -> list[Any]:
        """Results in rank order (``refs[i]`` is rank i's); a rank's failure raises.
        As in ``MultiprocExecutor._gather``, a rank that died is blamed before
        one that raised (its peers' collectives fail when it dies)."""
        ray = self.ray
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        raised: tuple[int, str] | None = None
        deadline: float | None = None
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not ready:  # grace over, nobody died
                break
            rank = rank_of[ready[0]]
            try:
                results[rank] = ray.get(ready[0])
            except ray.exceptions.RayActorError as err:
                self._fail(rank, f"died{self._where(rank)} ({first_line(err)})", what)
            except ray.exceptions.RayTaskError as err:
                cause = err.cause if err.cause is not None else err
                logger.error("worker rank %d failed in %s:\n%s", rank, what, err)
                if raised is None:
                    raised = (rank, f"raised {type(cause).__name__}: {cause}")
                    deadline = time.monotonic() + self.failure_grace_s
        if raised is not None:
            self._fail(*raised, what)
        return results

    def _where(self, rank: int) -> str:
        if rank >= len(self._nodes):
            return ""
        node_id, ip = self._nodes[rank]
        return f" on node {node_id[:12]} ({ip})"

    def _kill_workers(self) -> None:
        _kill(self.ray, self._actors)

    def shutdown(self) -> None:
        self._finalizer()  # runs once


def _kill(ray: Any, actors: list[Any]) -> None:
    for actor in actors:
        ray.kill(actor, no_restart=True)
    actors.clear()


def _release(ray: Any, actors: list[Any], group: Any) -> None:
    from ray.util.placement_group import remove_placement_group

    if ray.is_initialized():  # else Ray shut down first and took its actors with it
        _kill(ray, actors)
        remove_placement_group(group)
    RayInstance.release(ray)
