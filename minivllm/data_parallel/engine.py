"""``DataParallelEngine``: what ``LLM`` drives when ``parallel.dp > 1``.

It offers the part of ``LLMEngine``'s interface that ``LLM`` uses (its processor, add,
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
from transformers import PreTrainedTokenizerBase

from minivllm.config.vllm_config import ModelConfigView, VllmConfig
from minivllm.core.stats import SchedulerStats
from minivllm.engine.balancer import LoadBalancer
from minivllm.engine.core_client import EngineCoreClient, merge_stats
from minivllm.engine.engine_proc import EngineClient
from minivllm.engine.messages import Call, CollectiveRpc, EngineFailed, EngineOutputs, GetStats
from minivllm.engine.processor import ProcessedRequest, Processor
from minivllm.engine.ray_replica import RayReplicas
from minivllm.inputs import PromptType
from minivllm.lora_request import LoRARequest
from minivllm.outputs import PoolingRequestOutput, RequestOutput
from minivllm.pooling.params import PoolingParams
from minivllm.sampling_params import SamplingParams


class DataParallelEngine:
    def __init__(self, cfg: VllmConfig) -> None:
        self.cfg = cfg
        self._inbox: queue.SimpleQueue[tuple[int, EngineOutputs | EngineFailed | str]] = queue.SimpleQueue()
        """(replica, its message, or why its engine exited), from the replicas' reader threads."""
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

    # ---- vLLM's names, as ``LLMEngine`` has them -------------------------------------------
    @property
    def vllm_config(self) -> VllmConfig:
        return self.cfg

    @property
    def model_config(self) -> ModelConfigView:
        return ModelConfigView.of(self.cfg)

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        return self.tokenizer

    # ---- replica messages (on their reader threads) ---------------------------------------
    def _on_message(self, replica: int, msg: EngineOutputs | EngineFailed, now: float) -> None:
        self._inbox.put((replica, msg))

    def _on_exit(self, replica: int, reason: str) -> None:
        self._inbox.put((replica, reason))

    # ---- requests -------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str | None,
        prompt: PromptType,
        params: SamplingParams | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        group_id: str | None = None,
        pooling_params: PoolingParams | None = None,
        lora_request: LoRARequest | None = None,
    ) -> str:
        """``LLMEngine.add_request``: validate (``Processor.process``), then send to a replica."""
        request = self.processor.process(
            request_id,
            prompt,
            pooling_params if pooling_params is not None else params,
            lora_request=lora_request,
            priority=priority,
            cache_salt=cache_salt,
            group_id=group_id,
        )
        return self.add_processed(request)

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
            self._receive(*self._inbox.get())
        while not self._inbox.empty():
            self._receive(*self._inbox.get())
        ready, self._ready = self._ready, []
        return ready

    def _receive(self, replica: int, msg: EngineOutputs | EngineFailed | str) -> None:
        if isinstance(msg, str):  # the replica's process exited
            self.client.fail(replica, msg)
            self.client.check_alive()
        received = self.client.receive(replica, msg)
        self._replies.update(received.replies)
        self._ready.extend(received.outputs)
        self._ready.extend(received.pooled)
        self.client.check_alive()
        if received.refused:
            request_id, reason = next(iter(received.refused.items()))
            raise ValueError(f"request {request_id!r}: {reason}")

    # ---- calls answered by every replica ---------------------------------------------------
    def _ask_all(self, command: Callable[[int], Call]) -> list[Any]:
        """Send ``command(token)`` to each replica; their replies in replica order."""
        tokens = self.client.ask_all(command)
        while any(t not in self._replies for t in tokens):
            self._receive(*self._inbox.get())
        return [self._replies.pop(t) for t in tokens]

    def replica_stats(self) -> list[SchedulerStats]:
        """Each replica's scheduler stats, fresh (answered between two of its steps)."""
        return self._ask_all(GetStats)

    def scheduler_stats(self) -> SchedulerStats:
        return merge_stats(self.replica_stats())

    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        """Every replica's ranks, replica by replica (``dp x tp x pp`` results)."""
        call = cloudpickle.dumps((method, tuple(args), kwargs))
        results = []
        for replica, reply in enumerate(self._ask_all(lambda token: CollectiveRpc(token, call))):
            if isinstance(reply, BaseException):
                raise RuntimeError(f"data-parallel replica {replica}: {reply}")
            results.extend(reply)
        return results

    def shutdown(self) -> None:
        self.client.shutdown()
