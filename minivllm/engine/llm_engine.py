"""LLMEngine: tokenize, add requests, step the core, detokenize, build outputs."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler import EngineCoreOutput, SchedulerStats
from minivllm.engine.core import EngineCore
from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.engine.outputs import CompletionOutput, RequestOutput
from minivllm.engine.processor import Processor, PromptType
from minivllm.engine.request import Request, RequestId
from minivllm.engine.stats import EngineStats, StatLogger
from minivllm.engine.tokenizer import get_tokenizer
from minivllm.sampling_params import RequestOutputKind, SamplingParams


@dataclass
class _RequestState:
    """The front end's view of a request: text so far and what was last reported."""

    request_id: RequestId
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    arrival_time: float
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    first_token_time: float | None = None
    sent_tokens: int = 0
    sent_chars: int = 0


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
        self.core = EngineCore(cfg)
        self.processor = Processor(cfg, self.tokenizer, self.core.max_tokens_in_cache)
        self.counters = EngineCounters()
        self._states: dict[RequestId, _RequestState] = {}
        self._ids = itertools.count()
        self.stat_logger = StatLogger(cfg.scheduler.log_stats_interval)

    @property
    def eos_token_id(self) -> int | None:
        eos = getattr(self.cfg.hf_config, "eos_token_id", None)
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return self.tokenizer.eos_token_id if eos is None else eos

    @property
    def num_kv_blocks(self) -> int:
        return self.core.num_blocks

    def scheduler_stats(self) -> SchedulerStats:
        return self.core.scheduler.stats()

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
    ) -> RequestId:
        """Validate and queue a request; raises ValueError (nothing queued) on bad input.

        ``cache_salt``: only requests with the same salt share prefix-cache blocks.
        """
        params = params or SamplingParams()
        if params.n != 1:
            raise ValueError(f"n={params.n}: only n=1 is supported")
        _check_priority_and_salt(priority, cache_salt, self.cfg.scheduler.policy)
        text, ids = self.processor.tokenize(prompt)
        max_tokens = self.processor.max_output_tokens(len(ids), params)
        req_id = RequestId(str(next(self._ids)) if request_id is None else str(request_id))
        if req_id in self._states:
            raise ValueError(f"request_id={req_id!r}: already in use by an unfinished request")
        request = Request(req_id, ids, params, self.eos_token_id, max_tokens, priority=priority, cache_salt=cache_salt)
        detok = IncrementalDetokenizer(self.tokenizer, params, ids)
        self._states[req_id] = _RequestState(req_id, text, ids, params, detok, request.arrival_time)
        self.counters.num_prompt_tokens += len(ids)
        self.core.add_request(request)
        return req_id

    def abort_request(self, request_ids: str | list[str]) -> None:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        self.core.abort_requests([RequestId(r) for r in ids])
        for r in ids:
            self._states.pop(RequestId(r), None)

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return self.core.scheduler.num_unfinished_requests

    # ---- stepping -------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One engine step; returns outputs of the requests that advanced."""
        outputs = []
        prompt_tokens = generation_tokens = 0
        for core_out in self.core.step():
            state = self._states.get(core_out.req_id)
            if state is None:
                continue
            prompt_tokens += len(state.prompt_token_ids) if state.first_token_time is None else 0
            generation_tokens += len(core_out.new_token_ids)
            self._absorb(state, core_out)
            out = self._make_output(state)
            if state.finish_reason is not None:
                del self._states[state.request_id]
                self.counters.num_finished_requests += 1
            if out is not None:
                outputs.append(out)
        self.stat_logger.record_step(prompt_tokens, generation_tokens)
        self.stat_logger.maybe_log(self.scheduler_stats)
        return outputs

    def _absorb(self, state: _RequestState, core_out: EngineCoreOutput) -> None:
        now = time.monotonic()
        state.first_token_time = state.first_token_time or now
        state.token_ids.extend(core_out.new_token_ids)
        self.counters.num_generation_tokens += len(core_out.new_token_ids)
        if core_out.new_logprobs is not None:
            state.logprobs = (state.logprobs or []) + core_out.new_logprobs
            chosen = [lp[t] for t, lp in zip(core_out.new_token_ids, core_out.new_logprobs)]
            state.cumulative_logprob = (state.cumulative_logprob or 0.0) + sum(chosen)
        state.finish_reason, state.stop_reason = core_out.finish_reason, core_out.stop_reason
        stop = state.detokenizer.append(core_out.new_token_ids)
        if stop is not None and state.finish_reason is None:
            state.finish_reason, state.stop_reason = "stop", stop
            self.core.abort_requests([state.request_id])

    def _make_output(self, state: _RequestState) -> RequestOutput | None:
        finished = state.finish_reason is not None
        kind = state.params.output_kind
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        text, token_ids, logprobs = state.detokenizer.text, state.token_ids, state.logprobs
        if kind == RequestOutputKind.DELTA:
            text, token_ids = text[state.sent_chars :], token_ids[state.sent_tokens :]
            logprobs = logprobs[state.sent_tokens :] if logprobs is not None else None
            state.sent_chars, state.sent_tokens = len(state.detokenizer.text), len(state.token_ids)
        completion = CompletionOutput(
            index=0,
            text=text,
            token_ids=list(token_ids),
            cumulative_logprob=state.cumulative_logprob,
            logprobs=list(logprobs) if logprobs is not None else None,
            finish_reason=state.finish_reason,
            stop_reason=state.stop_reason,
        )
        metrics = {"arrival_time": state.arrival_time, "first_token_time": state.first_token_time or 0.0}
        if finished:
            metrics["finished_time"] = time.monotonic()
        return RequestOutput(
            request_id=state.request_id,
            prompt=state.prompt,
            prompt_token_ids=state.prompt_token_ids,
            outputs=[completion],
            finished=finished,
            metrics=metrics,
        )

    def shutdown(self) -> None:
        self.core.shutdown()


def _check_priority_and_salt(priority: int, cache_salt: str | None, policy: str) -> None:
    if not isinstance(priority, int):
        raise ValueError(f"priority={priority!r}: must be an int")
    if priority != 0 and policy != "priority":
        raise ValueError(f"priority={priority}: needs scheduler.policy=priority (the policy is {policy})")
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise ValueError(f"cache_salt={cache_salt!r}: must be a non-empty string or None")
