"""``DataParallelEngine``: what ``LLM`` drives when ``parallel.dp > 1``.

It offers the part of ``LLMEngine``'s interface that ``LLM`` uses (process, add,
abort, step, stats, collective_rpc), over ``dp`` engine processes, through the
``EngineCoreClient`` that ``AsyncLLM`` uses too::

    LLM.generate ─ DataParallelEngine ─ EngineCoreClient ─┬─ LoadBalancer.pick ─> replica 0: engine process
       Processor.process (tokenize, check once)           │                    > replica 1: engine process
                                                          └─ step(): outputs of whichever replicas have some

The replicas step on their own, concurrently; ``step()`` waits until at least
one of them reports, then returns every output that has arrived.
With ``parallel.dp_backend=ray`` the replicas are Ray actors (``engine/ray_replica.py``),
which ``EngineCoreClient`` places and starts for the server's ``AsyncLLM`` alike.
"""

from __future__ import annotations

import queue
from typing import Any, Callable

import cloudpickle

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.stats import SchedulerStats
from minivllm.engine.balancer import LoadBalancer
from minivllm.engine.core_client import EngineCoreClient, merge_stats
from minivllm.engine.engine_client import EngineClient
from minivllm.engine.engine_proc import EngineMessage
from minivllm.engine.outputs import RequestOutput
from minivllm.engine.processor import ProcessedRequest, Processor
from minivllm.engine.ray_replica import RayReplicas
from minivllm.engine.request_intake import RequestIntake
from minivllm.engine.vllm_names import VllmEngineNames
from minivllm.pooling.outputs import PoolingRequestOutput


class DataParallelEngine(RequestIntake, VllmEngineNames):
    def __init__(self, cfg: VllmConfig) -> None:
        self.cfg = cfg
        self._inbox: queue.SimpleQueue[tuple[int, EngineMessage | str]] = queue.SimpleQueue()
        self.client = EngineCoreClient(cfg, self._on_message, self._on_exit)
        self.tokenizer = self.client.tokenizer
        self.processor: Processor = self.client.processor
        self.num_kv_blocks = self.client.num_kv_blocks
        self._replies: dict[int, Any] = {}
        self._ready: list[RequestOutput | PoolingRequestOutput] = []
        """Outputs that arrived while waiting for a reply; the next step returns them."""

    @property
    def ray_replicas(self) -> RayReplicas | None:
        """parallel.dp_backend=ray: the replicas' placement (each replica is a Ray actor)."""
        return self.client.ray_replicas

    @property
    def balancer(self) -> LoadBalancer:
        return self.client.balancer

    @property
    def replicas(self) -> list[EngineClient]:
        return self.client.engines

    @property
    def eos_token_id(self) -> int | None:
        return self.processor.eos_token_id

    # ---- replica messages (on their reader threads) ---------------------------------------
    def _on_message(self, replica: int, msg: EngineMessage, now: float) -> None:
        self._inbox.put((replica, msg))

    def _on_exit(self, replica: int, reason: str) -> None:
        self._inbox.put((replica, reason))

    # ---- requests -------------------------------------------------------------------------
    def add_processed(self, request: ProcessedRequest) -> str:
        """Send a processed request to the replica the balancer picks (its engine does not check it again)."""
        self.client.add(request)
        return request.request_id

    def abort_request(self, request_ids: str | list[str]) -> None:
        self.client.abort([request_ids] if isinstance(request_ids, str) else list(request_ids))

    def has_unfinished_requests(self) -> bool:
        return self.client.num_unfinished > 0

    def get_num_unfinished_requests(self) -> int:
        return self.client.num_unfinished

    # ---- stepping -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput | PoolingRequestOutput]:
        """Outputs that have arrived from any replica, waiting for the first one."""
        if not self._ready:
            self._absorb(*self._inbox.get())
        while not self._inbox.empty():
            self._absorb(*self._inbox.get())
        ready, self._ready = self._ready, []
        return ready

    def _absorb(self, replica: int, msg: EngineMessage | str) -> None:
        if isinstance(msg, str):  # the replica's process exited
            self.client.fail(replica, msg)
            self.client.check_alive()
        arrival = self.client.absorb(replica, msg)
        self._replies.update(arrival.replies)
        self._ready.extend(arrival.outputs)
        self._ready.extend(arrival.pooled)
        self.client.check_alive()
        if arrival.refused:
            request_id, reason = next(iter(arrival.refused.items()))
            raise ValueError(f"request {request_id!r}: {reason}")

    # ---- calls answered by every replica ---------------------------------------------------
    def _ask_all(self, command: Callable[[int], tuple]) -> list[Any]:
        """Send ``command(token)`` to each replica; their replies in replica order."""
        tokens = self.client.ask_all(command)
        while any(t not in self._replies for t in tokens):
            self._absorb(*self._inbox.get())
        return [self._replies.pop(t) for t in tokens]

    def replica_stats(self) -> list[SchedulerStats]:
        """Each replica's scheduler stats, fresh (answered between two of its steps)."""
        return self._ask_all(lambda token: ("stats", token))

    def scheduler_stats(self) -> SchedulerStats:
        return merge_stats(self.replica_stats())

    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        """Every replica's ranks, replica by replica (``dp x tp x pp`` results)."""
        call = cloudpickle.dumps((method, tuple(args), kwargs))
        results = []
        for replica, reply in enumerate(self._ask_all(lambda token: ("rpc", token, call))):
            if isinstance(reply, BaseException):
                raise RuntimeError(f"data-parallel replica {replica}: {reply}")
            results.extend(reply)
        return results

    def shutdown(self) -> None:
        self.client.shutdown()
