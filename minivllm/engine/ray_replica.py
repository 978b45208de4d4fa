"""Data-parallel replicas as Ray actors (``parallel.dp_backend=ray``), so replicas can sit on several machines.

``RayReplicas`` reserves one bundle per replica in a placement group (the
replica's tp x pp devices: ``{"GPU": tp*pp}`` on CUDA, ``{"CPU": tp*pp}`` on the
CPU; none when the replica's own ranks are Ray actors, which reserve their own),
placed with ``parallel.placement_strategy``, and starts replica ``i``'s
``EngineActor`` in bundle ``i``. Each actor holds a whole ``LLMEngine``.
``EngineCoreClient`` (``core_client.py``) owns it, so both front ends, ``LLM``
(through ``DataParallelEngine``) and the server's ``AsyncLLM``, get Ray replicas alike.

``RayReplicaClient`` offers ``EngineClient``'s interface (``engine_proc.py``)
to ``EngineCoreClient``, which routes requests to it as to an engine process. A
driver thread per replica plays the engine process's loop remotely::

    send(command) ─> outbox ─> driver thread: actor.run(commands) ─> EngineActor (its node)
                                 on_message(EngineOutputs) <──┘      apply commands, one step

Each ``run`` applies the queued commands as the engine process applies those in
its pipe (``EngineLoop``: same commands, same replies), then runs one step
if a request is unfinished. While the engine is idle the thread waits on the
outbox, and every ``idle_check_s`` without a command it runs an empty ``run``,
so an idle replica's death is noticed within that time, as a process's is at once.
A dead actor (its process killed, its node lost) fails the thread's
``ray.get`` at once; the thread reports it through ``on_exit``, naming the node,
and ``EngineCoreClient`` names the replica.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from typing import Any, Callable

from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.engine_proc import EngineLoop, failed
from minivllm.engine.messages import Command, EngineFailed, EngineOutputs, EngineReady, Shutdown
from minivllm.executor.ray_cluster import (
    RayInstance,
    bundle_nodes,
    first_line,
    import_ray,
    node_of_this_process,
    reserve,
)

RAY_EXECUTOR = "minivllm.executor.ray_executor.RayDistributedExecutor"
IDLE_CHECK_S = 1.0
"""How long an idle replica's driver waits for a command before checking that its actor lives."""


class EngineActor:
    """The body of one replica's Ray actor: an ``LLMEngine``, driven one ``run`` at a time."""

    def __init__(self, cfg: VllmConfig, log_level: int) -> None:
        logging.basicConfig(level=log_level, format="%(asctime)s [replica] %(levelname)s %(name)s: %(message)s")
        self.cfg = cfg
        self.loop: EngineLoop | None = None

    def where(self) -> tuple[str, str, int]:
        """(Ray node id, node IP, process id) of this actor."""
        return (*node_of_this_process(), os.getpid())

    def start(self) -> EngineReady | EngineFailed:
        """Build the engine: ready, or why not."""
        from minivllm.engine.llm_engine import LLMEngine

        try:
            engine = LLMEngine(self.cfg)
        except BaseException as err:  # noqa: BLE001 - reported to the client, which raises it
            return failed(err)
        self.loop = EngineLoop(engine)
        return EngineReady(kv_spec=engine.core.kv_spec)

    def run(self, commands: list[Command]) -> tuple[list[EngineOutputs | EngineFailed], bool, bool]:
        """Apply ``commands``, then one step if a request is unfinished: one turn of the engine
        process's loop. Returns its messages, whether to go on (False after ``Shutdown`` or a
        failure; the engine is then shut down) and whether requests remain."""
        loop, engine = self.loop, self.loop.engine
        messages: list[EngineOutputs | EngineFailed] = []
        try:
            out = EngineOutputs()
            go_on = loop.apply(commands, out)
            messages += [out] if out else []
            if go_on and engine.has_unfinished_requests():
                step = loop.step()
                messages += [step] if step else []
        except Exception as err:  # noqa: BLE001 - the engine cannot go on; the client raises it
            messages.append(failed(err, at_start=False))
            go_on = False
        if not go_on:
            engine.shutdown()
        return messages, go_on, go_on and engine.has_unfinished_requests()


class RayReplicas:
    """The placement group of every replica, and the factory ``EngineCoreClient`` starts them with."""

    def __init__(self, cfg: VllmConfig) -> None:
        par = cfg.parallel
        self.ray = import_ray("parallel.dp_backend=ray")
        self._bundle = replica_bundle(cfg)
        self._group: Any = None
        RayInstance.acquire(self.ray)
        if self._bundle is not None:
            what = f"parallel.dp_backend=ray with parallel.dp={par.dp} replicas"
            try:
                self._group = reserve(
                    self.ray, self._bundle, par.dp, par.placement_strategy, par.placement_timeout_s, what
                )
            except BaseException:
                RayInstance.release(self.ray)
                raise
        self._finalizer = weakref.finalize(self, _release, self.ray, self._group)

    def start(
        self,
        cfg: VllmConfig,
        on_message: Callable[[EngineOutputs | EngineFailed, float], None],
        on_exit: Callable[[str], None],
    ) -> RayReplicaClient:
        """Start replica ``cfg.parallel.dp_rank`` in its bundle; returns once its model is loaded."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0}
        if self._group is not None:
            index = cfg.parallel.dp_rank
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self._group, index)
            options.update(num_gpus=self._bundle.get("GPU", 0.0), num_cpus=self._bundle.get("CPU", 0.0))
        level = logging.getLogger("minivllm").getEffectiveLevel()
        actor = self.ray.remote(EngineActor).options(**options).remote(cfg, level)
        return RayReplicaClient(self.ray, actor, on_message, on_exit)

    @property
    def bundle_node_ids(self) -> list[str]:
        """The node each replica's bundle sits on ([] when the replicas' ranks reserve their own)."""
        return bundle_nodes(self._group) if self._group is not None else []

    def release(self) -> None:
        self._finalizer()  # runs once


def replica_bundle(cfg: VllmConfig) -> dict[str, float] | None:
    """What one replica reserves: its ranks' devices, or nothing when its ranks are Ray actors."""
    if cfg.parallel.executor and cfg.parallel.executor.get("_target_") == RAY_EXECUTOR:
        return None
    return {"GPU" if cfg.device_type == "cuda" else "CPU": float(cfg.world_size)}


class RayReplicaClient:
    """``EngineClient``'s interface over one replica's ``EngineActor``."""

    def __init__(
        self,
        ray: Any,
        actor: Any,
        on_message: Callable[[EngineOutputs | EngineFailed, float], None],
        on_exit: Callable[[str], None],
        idle_check_s: float = IDLE_CHECK_S,
    ) -> None:
        """Wait until the actor's model is loaded. Raises ValueError for a config the engine
        refused, RuntimeError if it crashed or its actor died."""
        self.ray, self._actor = ray, actor
        self._idle_check_s = idle_check_s
        self._finalizer = weakref.finalize(self, _kill, ray, actor)
        try:
            self.node_id, self.node_ip, self.pid = ray.get(actor.where.remote())
            ready: EngineReady | EngineFailed = ray.get(actor.start.remote())
        except ray.exceptions.RayError as err:
            self._finalizer()
            raise RuntimeError(f"replica actor died while starting: {first_line(err)}") from None
        if isinstance(ready, EngineFailed):
            self._finalizer()
            raise (ValueError if ready.config_error else RuntimeError)(ready.reason)
        self.info = ready
        self._on_message, self._on_exit = on_message, on_exit
        self._outbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._driver = threading.Thread(target=self._drive, name="minivllm-ray-replica", daemon=True)
        self._driver.start()

    def _drive(self) -> None:
        busy = False
        while True:
            commands = self._take(block=not busy)
            try:
                messages, go_on, busy = self.ray.get(self._actor.run.remote(commands))
            except self.ray.exceptions.RayError as err:
                self._finalizer()
                where = f"node {self.node_id[:12]} ({self.node_ip})"
                return self._on_exit(f"Ray actor on {where} died: {first_line(err)}")
            now = time.monotonic()
            for msg in messages:
                self._on_message(msg, now)
            if not go_on:
                self._finalizer()
                return self._on_exit("engine actor stopped")

    def _take(self, block: bool) -> list[Command]:
        """Every queued command. While ``block``, waits for the first up to ``idle_check_s``;
        none then (an empty ``run`` follows: it checks that the actor lives)."""
        commands = []
        if block:
            try:
                commands.append(self._outbox.get(timeout=self._idle_check_s))
            except queue.Empty:
                return commands
        while True:
            try:
                commands.append(self._outbox.get_nowait())
            except queue.Empty:
                return commands

    def send(self, command: Command) -> None:
        """Queue a command; never blocks."""
        self._outbox.put(command)

    def is_alive(self) -> bool:
        return self._driver.is_alive()

    def request_stop(self) -> None:
        """Ask the engine to stop after its step, without waiting (``shutdown`` waits)."""
        if self._driver.is_alive():
            self._outbox.put(Shutdown())

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the engine to stop, wait ``timeout``, then kill the actor (idempotent)."""
        self.request_stop()
        self._driver.join(timeout)
        self._finalizer()


def _kill(ray: Any, actor: Any) -> None:
    if ray.is_initialized():  # else Ray shut down first and took its actors with it
        ray.kill(actor, no_restart=True)


def _release(ray: Any, group: Any) -> None:
    if group is not None and ray.is_initialized():
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(group)
    RayInstance.release(ray)
