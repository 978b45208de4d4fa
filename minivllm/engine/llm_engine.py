"""LLMEngine: admit requests (``Processor.process``), step the core, detokenize, build outputs."""

from __future__ import annotations

import atexit
import gc
import logging
from dataclasses import dataclass
from typing import Any, Callable

from transformers import PreTrainedTokenizerBase

from minivllm.config.vllm_config import ModelConfigView, VllmConfig
from minivllm.core.scheduler import SchedulerStats
from minivllm.engine.core import EngineCore
from minivllm.engine.detokenizer import (
    FinalDetokenizer,
    FinalTextDecoder,
    IncrementalDetokenizer,
    LogprobBuilder,
    wants_final_text_only,
)
from minivllm.engine.parent_request import CompletionState, ParentRequest
from minivllm.engine.processor import ProcessedRequest, Processor
from minivllm.engine.stats import EngineStats, StatLogger
from minivllm.inputs import PromptType
from minivllm.lora_request import LoRARequest
from minivllm.outputs import EngineCoreOutput, PoolingOutput, PoolingRequestOutput, RequestOutput
from minivllm.pooling.params import PoolingParams
from minivllm.request import Request, RequestId
from minivllm.sampling_params import RequestOutputKind, SamplingParams
from minivllm.tokenizer import get_tokenizer

logger = logging.getLogger(__name__)


@dataclass
class EngineCounters:
    """Totals since the engine started."""

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_finished_requests: int = 0


class LLMEngine:
    def __init__(self, cfg: VllmConfig) -> None:
        self.cfg = cfg
        self.tokenizer = get_tokenizer(cfg)
        self.final_text = FinalTextDecoder(self.tokenizer)
        """Decodes in one call the text of requests that show only their final output."""
        self.core = EngineCore(cfg)
        self.processor = Processor(cfg, self.tokenizer, self.core.kv_spec)
        self.counters = EngineCounters()
        self._states: dict[RequestId, CompletionState] = {}
        """Core request id -> its completion (a child of a parent request)."""
        self._parents: dict[RequestId, ParentRequest] = {}
        self._pooling: dict[RequestId, tuple[PoolingParams, list[int]]] = {}
        """runner=pooling: request id -> (its params, its prompt ids)."""
        self.stat_logger = StatLogger(cfg.scheduler.log_stats_interval)
        self.logprob_builder = LogprobBuilder(self.tokenizer)
        # The model, tokenizer and config are long-lived: move them out of the
        # collector's view so that per-step garbage collections stay short. What an
        # earlier engine froze is unfrozen first, so an engine dropped since then
        # (a cycle the collector must break) is freed rather than kept for good.
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        atexit.unregister(gc.unfreeze)  # once per process, however many engines
        atexit.register(gc.unfreeze)  # let the interpreter's last collection see them again

    # ---- vLLM's names, for scripts written against vLLM --------------------------------
    @property
    def vllm_config(self) -> VllmConfig:
        return self.cfg

    @property
    def model_config(self) -> ModelConfigView:
        """``llm.llm_engine.model_config.max_model_len`` and friends."""
        return ModelConfigView.of(self.cfg)

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        return self.tokenizer

    @property
    def eos_token_id(self) -> int | None:
        return self.processor.eos_token_id

    @property
    def num_kv_blocks(self) -> int:
        return self.core.num_blocks

    def scheduler_stats(self) -> SchedulerStats:
        return self.core.scheduler_stats()

    def get_stats(self) -> EngineStats:
        """Throughputs over the current stats window, queue sizes, KV usage, hit rate."""
        return self.stat_logger.snapshot(self.scheduler_stats())

    # ---- requests -------------------------------------------------------------------
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
        """Validate (``Processor.process``) and queue a request (``params.n`` core requests); raises
        ValueError (nothing queued) on bad input. ``request_id`` None: a new id of this engine's.

        ``cache_salt``: only requests with the same salt share prefix-cache blocks.
        ``group_id``: the client request it is part of (a server's request with several
        prompts); the scheduler takes turns between groups. Default: its own id.
        ``pooling_params``: a pooling request (model.runner=pooling) instead of ``params``.
        ``lora_request``: the adapter to run under (needs ``lora.enable_lora``).
        """
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

    def add_processed(self, request: ProcessedRequest) -> RequestId:
        """Queue a request ``Processor.process`` made (here, or in a front end whose engine runs in
        this process): nothing is tokenized or checked again. Raises ValueError (nothing queued)
        if its id is in use by an unfinished request."""
        req_id = RequestId(request.request_id)
        if self.core.asleep:
            raise ValueError(
                f"request {req_id!r}: the engine is sleeping ({', '.join(sorted(self.core.asleep))} put away); "
                "call wake_up() first"
            )
        if request.pooling_params is not None:
            return self._add_pooling_request(req_id, request)
        ids = request.prompt_token_ids
        parent = ParentRequest(req_id, request.prompt, ids, request.params)
        child_ids = [parent.child_id(i) for i in range(request.params.n)]
        self._check_unused(req_id, child_ids)
        self._parents[req_id] = parent
        for index, child_id in enumerate(child_ids):
            child_params = parent.child_params(index)
            core_request = Request(
                child_id,
                ids,
                child_params,
                request.eos_token_id,
                request.max_tokens,
                priority=request.priority,
                cache_salt=request.cache_salt,
                group_id=request.group_id,
                lora_request=request.lora_request,
                final_output_only=_reads_only_final_output(child_params),
                mm_features=request.mm_features,
            )
            if wants_final_text_only(child_params):
                detok = FinalDetokenizer(self.final_text, child_params, ids)
            else:
                detok = IncrementalDetokenizer(self.tokenizer, child_params, ids)
            state = CompletionState(child_id, index, parent, detok)
            parent.children.append(state)
            self._states[child_id] = state
            self.counters.num_prompt_tokens += len(ids)
            self.core.add_request(core_request)
        return req_id

    def _add_pooling_request(self, req_id: RequestId, request: ProcessedRequest) -> RequestId:
        """One core request that computes the prompt and returns its pooled vector (runner=pooling)."""
        self._check_unused(req_id, [req_id])
        ids = request.prompt_token_ids
        self._pooling[req_id] = (request.pooling_params, ids)
        self.counters.num_prompt_tokens += len(ids)
        self.core.add_request(
            Request(
                req_id,
                ids,
                request.params,
                None,
                max_tokens=request.max_tokens,
                priority=request.priority,
                cache_salt=request.cache_salt,
                group_id=request.group_id,
            )
        )
        return req_id

    def _check_unused(self, req_id: RequestId, child_ids: list[RequestId]) -> None:
        if req_id in self._parents or req_id in self._pooling or any(c in self._states for c in child_ids):
            raise ValueError(f"request_id={req_id!r}: already in use by an unfinished request")

    def _pooled_output(self, core_out: EngineCoreOutput) -> PoolingRequestOutput:
        params, ids = self._pooling.pop(core_out.req_id)
        data = params.finish(core_out.pooling_output, self.cfg.model.pooler_config.normalize)
        return PoolingRequestOutput(core_out.req_id, PoolingOutput(data), ids, True, core_out.num_cached_tokens)

    def abort_request(self, request_ids: str | list[str]) -> None:
        """Abort requests by the ids add_request returned (all their completions)."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        child_ids = []
        for r in map(RequestId, ids):
            if self._pooling.pop(r, None) is not None:
                child_ids.append(r)
                continue
            parent = self._parents.pop(r, None)
            children = parent.children if parent is not None else [s for s in [self._states.get(r)] if s]
            child_ids.extend(c.request_id for c in children)
        self.core.abort_requests(child_ids)
        for c in child_ids:
            self._states.pop(c, None)

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.core.num_unfinished_requests

    # ---- stepping -------------------------------------------------------------------
    def step(self) -> list[RequestOutput | PoolingRequestOutput]:
        """One engine step; returns one output per request that advanced (and, for
        requests asking for the final output only, once they finished)."""
        advanced: dict[RequestId, list[CompletionState]] = {}
        prompt_tokens = 0
        states, pooling = self._states, self._pooling
        pooled = []
        generated_before = self.core.num_generated_tokens
        for core_out in self.core.step():
            if pooling and core_out.pooling_output is not None:
                pooled.append(self._pooled_output(core_out))
                self.counters.num_finished_requests += 1
                prompt_tokens += len(pooled[-1].prompt_token_ids)
                continue
            state = states.get(core_out.req_id)
            if state is None:
                continue
            parent = state.parent
            if not state.token_ids:
                prompt_tokens += len(parent.prompt_token_ids)
            if core_out.new_logprobs is not None or core_out.prompt_logprobs is not None:
                self._wrap_logprobs(core_out, parent.params)
            if parent.first_token_time is None or core_out.prompt_logprobs is not None:
                parent.note_first_output(core_out)
            if state.append_output(core_out):  # a stop string: the core does not know yet
                self.core.abort_requests([state.request_id])
            if state.finished:
                del states[state.request_id]
                parent.num_unfinished -= 1
            elif parent.final_only:
                continue  # nothing to show before the end
            advanced.setdefault(parent.request_id, []).append(state)
        # Counted by the scheduler: final-only requests report their tokens only at the end.
        # A pooling request's one token is a placeholder, not generated text.
        generation_tokens = self.core.num_generated_tokens - generated_before - len(pooled)
        self.counters.num_generation_tokens += generation_tokens
        outputs = []
        for parent_id, children in advanced.items():
            parent = self._parents[parent_id]
            out = parent.make_output(children)
            if parent.finished:
                del self._parents[parent_id]
                self.counters.num_finished_requests += 1
            if out is not None:
                outputs.append(out)
        self.stat_logger.record_step(prompt_tokens, generation_tokens)
        self.stat_logger.maybe_log(self.scheduler_stats)
        if pooled:
            outputs.extend(pooled)
        return outputs

    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        """A user's call on every worker (``Executor.user_collective_rpc``); one result per rank."""
        return self.core.executor.user_collective_rpc(method, args, kwargs)

    def _wrap_logprobs(self, core_out: EngineCoreOutput, params: SamplingParams) -> None:
        """The workers' {token: float} dicts as {token: Logprob} (rank and text added)."""
        build = self.logprob_builder.positions
        if core_out.new_logprobs is not None:
            core_out.new_logprobs = build(core_out.new_logprobs, params.logprobs, params.detokenize)
        if core_out.prompt_logprobs is not None:
            core_out.prompt_logprobs = build(core_out.prompt_logprobs, params.prompt_logprobs, params.detokenize)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block; False (nothing changed, a warning logged) while
        requests hold blocks."""
        if self.core.reset_prefix_cache():
            return True
        logger.warning(
            "reset_prefix_cache: %d request(s) unfinished hold KV blocks; nothing was reset",
            self.get_num_unfinished_requests(),
        )
        return False

    def sleep(self, level: int = 1) -> None:
        """Sleep mode (``EngineCore.sleep``): level 1 frees the KV cache and offloads the weights,
        level 2 discards both."""
        self.core.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back "weights" and/or "kv_cache" (both when None)."""
        self.core.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.core.is_sleeping()

    def shutdown(self) -> None:
        self.core.shutdown()


def _reads_only_final_output(params: SamplingParams) -> bool:
    """Whether this front end needs a request's tokens only with its first output (time to
    first token, prompt tokens counted) and its last: nothing streams, no stop string is
    searched in the text, no logprobs arrive per step."""
    return (
        params.output_kind == RequestOutputKind.FINAL_ONLY
        and not params.stop
        and params.logprobs is None
        and params.prompt_logprobs is None
    )
