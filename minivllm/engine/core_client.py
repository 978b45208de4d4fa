"""``EngineCoreClient``: the front end's side of ``parallel.dp`` engine processes
(one when dp=1), or, with ``parallel.dp_backend=ray``, of ``dp`` Ray actors
(``ray_replica.py``), shared by ``AsyncLLM`` and ``DataParallelEngine`` (vLLM
keeps its core clients in ``v1/engine/core_client.py``)::

    Processor.process ─> EngineCoreClient.add ─ LoadBalancer.pick ─┬─> EngineClient 0 ─> engine process 0
    (check, tokenize once)                                           └─> EngineClient 1 ─> engine process 1
    owner's thread <─ receive(replica, message): outputs, refusals, replies, failures

It starts the replicas, builds the one ``Processor`` every request passes
(capped by the smallest replica's KV cache), routes adds and aborts, tracks
each unfinished request's replica, hands out call tokens for replies, and
records the first failure (naming the replica when there are several). It
never blocks on the engines and owns no thread: engine messages arrive on the
``EngineClient`` reader threads through the callbacks its owner passes, and the
owner hands them back to ``receive`` on its own thread (the event loop, or the
thread calling ``step``), so the bookkeeping is single-threaded.
"""

from __future__ import annotations

import copy
import itertools
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from multiprocessing.util import Finalize
from typing import Any, Callable, Sequence

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.stats import SchedulerStats
from minivllm.engine.balancer import LoadBalancer
from minivllm.engine.engine_proc import EXIT_PRIORITY, EngineClient
from minivllm.engine.messages import AbortRequests, AddRequest, Call, EngineFailed, EngineOutputs
from minivllm.engine.processor import ProcessedRequest, Processor
from minivllm.engine.ray_replica import RayReplicas
from minivllm.engine.request_stream import EngineDeadError
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.tokenizer import get_tokenizer

logger = logging.getLogger(__name__)

OnMessage = Callable[[int, EngineOutputs | EngineFailed, float], None]
"""``(replica, message, arrival_time)``, called on the replica's reader thread."""
OnExit = Callable[[int, str], None]
"""``(replica, reason)``, called when the replica's engine process has exited."""
StartReplica = Callable[[VllmConfig, Callable[[EngineOutputs | EngineFailed, float], None], Callable[[str], None]], Any]
"""Starts one replica, ``(its config, on_message, on_exit)``, and returns once its model is loaded:
``EngineClient`` (an engine process), or ``RayReplicas.start`` (a Ray actor, ``ray_replica.py``)."""


@dataclass(slots=True)
class _Routed:
    replica: int
    prompt: str | None
    prompt_token_ids: list[int]


class EngineCoreClient:
    def __init__(self, cfg: VllmConfig, on_message: OnMessage, on_exit: OnExit) -> None:
        """Start every replica (returns once each model is loaded): an engine process each, or a
        Ray actor each with ``parallel.dp_backend=ray``; raises as ``start_engines``."""
        self.cfg = cfg
        self.tokenizer = get_tokenizer(cfg)
        self.ray_replicas = RayReplicas(cfg) if cfg.parallel.dp_backend == "ray" else None
        """parallel.dp_backend=ray: the replicas' placement group (released by ``shutdown``)."""
        try:
            start = self.ray_replicas.start if self.ray_replicas is not None else EngineClient
            self.engines = start_engines(cfg, on_message, on_exit, start)
        except BaseException:
            self._release_ray()
            raise
        kv_spec = KVCacheSpec.merge(c.info.kv_spec for c in self.engines)  # a request must fit any replica
        self.num_kv_blocks = kv_spec.num_blocks
        self.processor = Processor(cfg, self.tokenizer, kv_spec)
        self.processor.engine_in_other_process = True
        self.balancer = LoadBalancer(len(self.engines), cfg.cache.block_size, cfg.cache.enable_prefix_caching)
        self.failure: str | None = None
        """Why the engines stopped serving, once they have (the first failure, or a shutdown)."""
        self._requests: dict[str, _Routed] = {}
        """Unfinished request id -> its replica and prompt."""
        self._tokens = itertools.count()
        self._closing = False
        # At exit, ask every engine to stop at once, before each EngineClient's finalizer
        # (a lower priority) waits for its own: they stop together, not one after the other.
        Finalize(self, _request_stops, args=(list(self.engines),), exitpriority=EXIT_PRIORITY + 1)

    # ---- requests -------------------------------------------------------------------------
    def add(self, request: ProcessedRequest) -> int:
        """Send a processed request to the replica the balancer picks; returns that replica.
        Raises ValueError (nothing sent) if its id is unfinished, EngineDeadError after a failure."""
        self.check_alive()
        if request.request_id in self._requests:
            raise ValueError(f"request_id={request.request_id!r}: already in use by an unfinished request")
        replica = self.balancer.pick(request.prompt_token_ids)
        self._requests[request.request_id] = _Routed(replica, request.prompt, request.prompt_token_ids)
        self.engines[replica].send(AddRequest(request))
        return replica

    def abort(self, request_ids: Sequence[str]) -> list[str]:
        """Stop unfinished requests on their replicas (ids not unfinished are ignored); returns those stopped."""
        by_replica: dict[int, list[str]] = {}
        for request_id in map(str, request_ids):
            routed = self.finish(request_id)
            if routed is not None:
                by_replica.setdefault(routed.replica, []).append(request_id)
        if self.failure is None:
            for replica, some in by_replica.items():
                self.engines[replica].send(AbortRequests(some))
        return [r for some in by_replica.values() for r in some]

    def finish(self, request_id: str) -> _Routed | None:
        """Stop tracking a request (it finished, or the engine refused it); None if it was not tracked."""
        routed = self._requests.pop(request_id, None)
        if routed is not None:
            self.balancer.finished(routed.replica)
        return routed

    @property
    def num_unfinished(self) -> int:
        return len(self._requests)

    # ---- calls answered by every replica ---------------------------------------------------
    def ask_all(self, command: Callable[[int], Call]) -> list[int]:
        """Send ``command(token)`` to each replica; the tokens their replies will carry, in replica order."""
        self.check_alive()
        tokens = []
        for engine in self.engines:
            tokens.append(next(self._tokens))
            engine.send(command(tokens[-1]))
        return tokens

    # ---- what the engines say (on the owner's thread) ---------------------------------------
    def receive(self, replica: int, msg: EngineOutputs | EngineFailed) -> EngineOutputs:
        """Account for one message of ``replica``: outputs of requests aborted meanwhile are
        dropped, finished and refused requests stop being tracked, a failure is recorded."""
        if isinstance(msg, EngineFailed):
            return EngineOutputs(failure=self.fail(replica, f"engine failed: {msg.reason}"))
        received = EngineOutputs(added=msg.added, replies=msg.replies)
        for request_id, reason in msg.refused.items():
            self.finish(request_id)
            received.refused[request_id] = reason
        for out in msg.outputs:
            routed = self._requests.get(out.request_id)
            if routed is None:
                continue  # aborted meanwhile
            out.prompt, out.prompt_token_ids = routed.prompt, routed.prompt_token_ids
            if out.finished:
                self.finish(out.request_id)
            received.outputs.append(out)
        for pooled in msg.pooled:
            if self.finish(pooled.request_id) is not None:
                received.pooled.append(pooled)
        return received

    def fail(self, replica: int, reason: str) -> str:
        """Record that ``replica`` stopped (logged unless shutting down); returns the first failure."""
        if len(self.engines) > 1:
            reason = f"data-parallel replica {replica}: {reason}"
        if self.failure is None:
            if not self._closing:
                logger.error("%s", reason)
            self.failure = reason
        return self.failure

    def check_alive(self) -> None:
        if self.failure is not None:
            raise EngineDeadError(self.failure)

    # ---- the processes (or actors) ------------------------------------------------------------
    @property
    def pids(self) -> list[int | None]:
        """Each replica's engine process (its actor's process with ``dp_backend=ray``)."""
        return [c.pid for c in self.engines]

    @property
    def is_running(self) -> bool:
        return self.failure is None and all(c.is_alive() for c in self.engines)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop every engine process or actor (idempotent); later calls raise EngineDeadError."""
        self._closing = True
        _request_stops(self.engines)  # all at once; each then takes seconds to exit
        for engine in self.engines:
            engine.shutdown(timeout)
        self.failure = self.failure or "engine shut down"
        self._release_ray()

    def _release_ray(self) -> None:
        if self.ray_replicas is not None:
            self.ray_replicas.release()  # idempotent


def _request_stops(engines: list[EngineClient]) -> None:
    for engine in engines:
        engine.request_stop()


def replica_config(cfg: VllmConfig, replica: int) -> VllmConfig:
    """``cfg`` for replica ``replica``: the same engine, its own ``parallel.dp_rank`` (its devices)."""
    if cfg.parallel.dp == 1:
        return cfg
    own = copy.deepcopy(cfg)
    own.parallel.dp_rank = replica
    return own


def start_engines(
    cfg: VllmConfig, on_message: OnMessage, on_exit: OnExit, start_replica: StartReplica = EngineClient
) -> list[EngineClient]:
    """One engine (``start_replica``) per replica, started together; returns once every model is loaded.

    If one fails to start, the others are stopped and its error is raised
    (a ValueError, a bad config, as is; a crash naming the replica).
    """
    dp = cfg.parallel.dp

    def start(replica: int) -> EngineClient:
        return start_replica(replica_config(cfg, replica), partial(on_message, replica), partial(on_exit, replica))

    if dp == 1:
        return [start(0)]
    with ThreadPoolExecutor(max_workers=dp, thread_name_prefix="minivllm-dp-start") as pool:
        futures = [pool.submit(start, r) for r in range(dp)]
    started = [f.result() for f in futures if f.exception() is None]
    failed = [(r, f.exception()) for r, f in enumerate(futures) if f.exception() is not None]
    if failed:
        for client in started:
            client.shutdown()
        replica, err = failed[0]
        if isinstance(err, ValueError):
            raise err
        raise RuntimeError(f"data-parallel replica {replica}: {err}") from err
    return started


def merge_stats(stats: list[SchedulerStats]) -> SchedulerStats:
    """The replicas' scheduler stats as one engine's: counts add up; KV usage is over all blocks."""
    if len(stats) == 1:
        return stats[0]
    total = SchedulerStats(
        **{name: sum(getattr(s, name) for s in stats) for name in _COUNTS},
    )
    used = sum(s.num_blocks - s.num_free_blocks for s in stats)
    total.kv_cache_usage = used / total.num_blocks if total.num_blocks else 0.0
    total.spec_decoding = any(s.spec_decoding for s in stats)
    return total


_COUNTS = (
    "num_running",
    "num_waiting",
    "num_preemptions",
    "num_free_blocks",
    "num_blocks",
    "num_preempted",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "external_prefix_cache_queries",
    "external_prefix_cache_hits",
    "spec_num_drafts",
    "spec_num_draft_tokens",
    "spec_num_accepted_tokens",
)
