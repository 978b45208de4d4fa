"""``DataParallelEngine``: what ``LLM`` drives when ``parallel.dp > 1``.

It offers the part of ``LLMEngine``'s interface that ``LLM`` uses (add, abort,
step, stats, collective_rpc), over ``dp`` engine processes::

    LLM.generate ─ DataParallelEngine ─┬─ LoadBalancer.pick ─> replica 0: engine process (LLMEngine, tp ranks)
       tokenize, validate              │                     > replica 1: engine process (LLMEngine, tp ranks)
                                       └─ step(): outputs of whichever replicas have some, as they arrive

The replicas step on their own, concurrently; ``step()`` waits until at least
one of them reports, then returns every output that has arrived.
"""
from __future__ import annotations

import itertools
import queue
from dataclasses import dataclass
from typing import Any, Callable

import cloudpickle

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.stats import SchedulerStats
from minivllm.data_parallel.balancer import LoadBalancer
from minivllm.data_parallel.replicas import merge_stats, start_engines
from minivllm.engine.engine_proc import EngineMessage, unpack_output
from minivllm.engine.outputs import RequestOutput
from minivllm.engine.processor import Processor, PromptType
from minivllm.engine.tokenizer import get_tokenizer
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.lora.request import LoRARequest
from minivllm.pooling.outputs import PoolingRequestOutput
from minivllm.pooling.params import PoolingParams
from minivllm.sampling_params import SamplingParams


@dataclass(slots=True)
class _Routed:
    replica: int
    prompt: str | None
    prompt_token_ids: list[int]


class DataParallelEngine:
    def __init__(self, cfg: VllmConfig) -> None:
        self.cfg = cfg
        self.tokenizer = get_tokenizer(cfg)
        self._inbox: queue.SimpleQueue[tuple[int, EngineMessage | str]] = queue.SimpleQueue()
        self.replicas = start_engines(cfg, self._on_message, self._on_exit)
        kv_spec = KVCacheSpec.merge(c.info.kv_spec for c in self.replicas)  # a request must fit any replica
        self.num_kv_blocks = kv_spec.num_blocks
        self.processor = Processor(cfg, self.tokenizer, kv_spec)
        self.balancer = LoadBalancer(cfg.parallel.dp, cfg.cache.block_size, cfg.cache.enable_prefix_caching)
        self._requests: dict[str, _Routed] = {}
        self._ids = itertools.count()
        self._tokens = itertools.count()
        self._replies: dict[int, Any] = {}
        self._ready: list[RequestOutput] = []
        """Outputs that arrived while waiting for a reply; the next step returns them."""
        self._failure: str | None = None

    # ---- replica messages (on their reader threads) ---------------------------------------
    def _on_message(self, replica: int, msg: EngineMessage, now: float) -> None:
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
        lora_request: LoRARequest | None = None,
        pooling_params: PoolingParams | None = None,
    ) -> str:
        """Validate, pick a replica and queue the request there; raises ValueError (nothing queued) on bad input.
        ``group_id``: the client request it is part of (that replica's scheduler takes turns between them).
        ``lora_request``: the adapter to run under (every replica loads it on first use).
        ``pooling_params``: a pooling request (model.runner=pooling), balanced like the others."""
        self._check_alive()
        if cache_salt is not None:
            raise ValueError("cache_salt: not supported with parallel.dp > 1; leave it None")
        if pooling_params is not None:
            if lora_request is not None:
                raise ValueError("lora_request: pooling runs the base model; leave it None with pooling_params")
            params = pooling_params
            text, ids = self.processor.tokenize(prompt, pooling_params.truncate_prompt_tokens)
        else:
            params = params or SamplingParams()
            self.processor.lora.check(lora_request)
            text, ids = self.processor.tokenize(prompt)
            self.processor.max_output_tokens(len(ids), params)
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self._requests:
            raise ValueError(f"request_id={request_id!r}: already in use by an unfinished request")
        replica = self.balancer.pick(ids)
        self._requests[request_id] = _Routed(replica, text, ids)
        prompt_ids = {"prompt": text, "prompt_token_ids": ids}
        self.replicas[replica].send(("add", request_id, prompt_ids, params, priority, group_id, lora_request))
        return request_id

    def abort_request(self, request_ids: str | list[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        by_replica: dict[int, list[str]] = {}
        for request_id in ids:
            routed = self._requests.pop(str(request_id), None)
            if routed is not None:
                by_replica.setdefault(routed.replica, []).append(str(request_id))
                self.balancer.finished(routed.replica)
        if self._failure is None:
            for replica, some in by_replica.items():
                self.replicas[replica].send(("abort", some))

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests)

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
        if isinstance(msg, str) or msg.fatal is not None:
            reason = msg if isinstance(msg, str) else msg.fatal
            self._failure = self._failure or f"data-parallel replica {replica}: {reason}"
            raise RuntimeError(f"{self._failure}; the engine cannot continue")
        self._replies.update(msg.replies)
        for packed in msg.outputs:
            out = unpack_output(packed)
            routed = self._requests.get(out.request_id)
            if routed is None:
                continue  # aborted meanwhile
            out.prompt, out.prompt_token_ids = routed.prompt, routed.prompt_token_ids
            if out.finished:
                del self._requests[out.request_id]
                self.balancer.finished(replica)
            self._ready.append(out)
        for pooled in msg.pooled:
            self._absorb_pooled(replica, pooled)
        if msg.add_errors:
            request_id, reason = next(iter(msg.add_errors.items()))
            self.abort_request(list(msg.add_errors))
            raise ValueError(f"request {request_id!r}: {reason}")

    def _absorb_pooled(self, replica: int, pooled: PoolingRequestOutput) -> None:
        if self._requests.pop(pooled.request_id, None) is None:
            return  # aborted meanwhile
        self.balancer.finished(replica)
        self._ready.append(pooled)

    def _check_alive(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"{self._failure}; the engine cannot continue")

    # ---- calls answered by every replica ---------------------------------------------------
    def _ask_all(self, command: Callable[[int], tuple]) -> list[Any]:
        """Send ``command(token)`` to each replica; their replies in replica order."""
        self._check_alive()
        tokens = []
        for client in self.replicas:
            tokens.append(next(self._tokens))
            client.send(command(tokens[-1]))
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
        for client in self.replicas:
            client.shutdown()
