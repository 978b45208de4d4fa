"""EngineCore: the loop schedule -> execute -> update, with no tokenizer in sight.

With ``scheduler.async_scheduling`` one step is kept in flight: each ``step()``
schedules and launches step k+1, then waits for step k's tokens and processes
them, so the host's scheduling and input preparation overlap the device's work
(see ``Scheduler`` for what the scheduler assumes about the tokens in flight)::

    sync:   schedule k | run k | wait k | update k | schedule k+1 | run k+1 ...
    async:  schedule k+1 | launch k+1 | wait k | update k | schedule k+2 | launch k+2 | wait k+1 ...

With pipeline micro-batching (``parallel.pp_microbatches > 1``, vLLM's batch
queue) up to that many batches are in flight, each over requests that no other
batch in flight holds (``Scheduler.in_flight``), so stage 0 runs batch k+1
while stage 1 runs batch k. A step schedules and submits a batch without
waiting; it waits for the oldest batch only when the queue is full or nothing
new could be scheduled::

    pp=2, 2 micro-batches:  submit A | submit B, wait A, update A | submit C, wait B, update B ...
"""

from __future__ import annotations

import logging
from collections import deque

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.core.stats import SchedulerStats
from minivllm.executor.base import Executor
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.models.registry import check_pipeline_parallel
from minivllm.outputs import EngineCoreOutput, StepResult
from minivllm.plugins import load_general_plugins
from minivllm.request import Request, RequestId
from minivllm.utils import instantiate_target
from minivllm.worker.sleep import check_level, check_tags

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, cfg: VllmConfig) -> None:
        self.cfg = cfg
        if cfg.parallel.pp > 1:  # the model class must split into stages; the config cannot tell
            load_general_plugins(cfg.plugins)  # in an engine process, a plugin may register the class
            check_pipeline_parallel(cfg.architecture, cfg.parallel.pp)
        self.executor: Executor = instantiate_target(cfg.parallel.executor, cfg=cfg)
        try:
            self.kv_spec: KVCacheSpec = self.executor.determine_kv_cache_spec()
            """The cache the workers allocated, and the loaded model's sliding window."""
            self.executor.initialize_cache(self.kv_spec.num_blocks)
        except BaseException:
            self.executor.shutdown()
            raise
        self._log_capacity()
        self.scheduler = Scheduler(cfg, self.kv_spec)
        self._in_flight: tuple[SchedulerOutput, StepResult] | None = None
        """Async scheduling: the launched step whose tokens are not processed yet."""
        self.max_batches = cfg.parallel.num_microbatches
        self._batches: deque[tuple[SchedulerOutput, StepResult]] = deque()
        """Micro-batching: submitted batches whose outputs are not processed yet, oldest first."""
        self.asleep: set[str] = set()
        """Sleep mode: what the workers have put away ("weights", "kv_cache"); empty while awake."""

    def _log_capacity(self) -> None:
        spec = self.kv_spec
        # fewer blocks per request when out-of-window blocks are freed
        per_request = spec.max_blocks_per_request(self.cfg.max_model_len, self.cfg.scheduler.max_num_batched_tokens)
        logger.info(
            "KV cache: %d blocks of %d tokens (%d tokens, %.0f bytes a token); max concurrency at max_model_len=%d: %.2fx",
            spec.num_blocks,
            spec.block_size,
            spec.num_tokens,
            spec.bytes_per_token,
            self.cfg.max_model_len,
            spec.num_blocks / per_request,
        )
        if spec.num_state_slots:
            logger.info(
                "Linear-attention states: %d slots of %d bytes (%.2f MiB), one per running request",
                spec.num_state_slots,
                spec.state_slot_bytes,
                spec.state_bytes / 2**20,
            )
        scheduler, defaulted = self.cfg.scheduler, self.cfg.defaulted_scheduler_keys
        logger.info(
            "Scheduler: up to %d requests and %d tokens a step (max_num_seqs, max_num_batched_tokens)%s",
            scheduler.max_num_seqs,
            scheduler.max_num_batched_tokens,
            f"; {', '.join(defaulted)} null: the {self.cfg.device_type} default" if defaulted else "",
        )

    @property
    def num_blocks(self) -> int:
        return self.kv_spec.num_blocks

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the whole KV cache holds (blocks x block size): no request may need more."""
        return self.kv_spec.num_tokens

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[RequestId]) -> None:
        self.scheduler.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self._in_flight is not None or bool(self._batches)

    @property
    def num_unfinished_requests(self) -> int:
        """Requests waiting or running in the scheduler."""
        return self.scheduler.num_unfinished_requests

    @property
    def num_generated_tokens(self) -> int:
        """Output tokens sampled since the engine started (``Scheduler.num_generated_tokens``)."""
        return self.scheduler.num_generated_tokens

    def scheduler_stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block; False (nothing changed) while requests hold blocks."""
        return self.scheduler.reset_prefix_cache()

    # ---- sleep mode (worker/sleep.py) ----------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Free the workers' KV cache and weights' device memory (see ``Worker.sleep``). Refused
        while requests are unfinished; the prefix cache is forgotten (its KV is gone)."""
        if not self.cfg.model.enable_sleep_mode:
            raise ValueError("sleep: sleep mode is off; build the engine with enable_sleep_mode=True")
        check_level(level)
        if self.has_unfinished_requests():
            raise ValueError(
                f"sleep: {self.num_unfinished_requests} request(s) unfinished; let them finish or abort them first"
            )
        if self.asleep:
            raise ValueError(f"sleep: already asleep ({', '.join(sorted(self.asleep))}); wake_up first")
        self.scheduler.reset_prefix_cache()  # cannot fail: no request holds a block
        self.executor.collective_rpc("sleep", (level,))
        self.asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back the weights and/or the KV cache (both when ``tags`` is None)."""
        if not self.cfg.model.enable_sleep_mode:
            raise ValueError("wake_up: sleep mode is off; build the engine with enable_sleep_mode=True")
        tags = check_tags(tags)
        self.executor.collective_rpc("wake_up", (tags,))
        self.asleep.difference_update(tags)

    def is_sleeping(self) -> bool:
        return bool(self.asleep)

    def step(self) -> list[EngineCoreOutput]:
        if self.cfg.async_scheduling:
            return self._step_overlapped()
        if self.max_batches > 1:
            return self._step_with_batch_queue()
        return self._step_sync()

    def _step_with_batch_queue(self) -> list[EngineCoreOutput]:
        """Submit a new batch if a slot is free; process the oldest batch's output when
        the queue is full or there was nothing new to submit."""
        submitted = False
        if len(self._batches) < self.max_batches:
            scheduler_output = self.scheduler.schedule()
            # an empty one with requests to forget lets workers drop their state
            if not scheduler_output.is_empty or scheduler_output.forget_req_ids:
                self._batches.append((scheduler_output, self.executor.execute_model_async(scheduler_output)))
                submitted = not scheduler_output.is_empty
        if not self._batches or (submitted and len(self._batches) < self.max_batches):
            return []
        scheduler_output, launched = self._batches.popleft()
        return self.scheduler.update_from_output(scheduler_output, launched.result())

    def _step_overlapped(self) -> list[EngineCoreOutput]:
        results = []
        if self._in_flight is not None and self.scheduler.has_grammars:
            # Grammar masks need every token so far: no speculation while a request has one.
            results = self._finish_in_flight()
        scheduler_output = self.scheduler.schedule()
        launched = None
        if not scheduler_output.is_empty or scheduler_output.forget_req_ids:
            launched = self.executor.execute_model_async(scheduler_output)
        if self._in_flight is not None:
            results = self._finish_in_flight()
        running = launched is not None and not scheduler_output.is_empty
        self._in_flight = (scheduler_output, launched) if running else None
        return results

    def _finish_in_flight(self) -> list[EngineCoreOutput]:
        scheduler_output, launched = self._in_flight
        self._in_flight = None
        return self.scheduler.update_from_output(scheduler_output, launched.result())

    def _step_sync(self) -> list[EngineCoreOutput]:
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            if scheduler_output.forget_req_ids:  # let workers drop state of aborted requests
                self.executor.execute_model(scheduler_output)
            return []
        output = self.executor.execute_model(scheduler_output)
        return self.scheduler.update_from_output(scheduler_output, output)

    def shutdown(self) -> None:
        self.executor.shutdown()
