"""The front end's view of a request: one prompt, ``n`` completions.

A request with ``n > 1`` fans out into ``n`` core requests ("children") with ids
``"{index}_{request_id}"`` (``n == 1`` keeps the request id). Children are
ordinary requests to the scheduler; with prefix caching on they share the
prompt's full KV blocks. Seeded children get ``seed + index`` so their
completions differ. Their outputs are merged here into one RequestOutput whose
``outputs[i].index == i``:

- CUMULATIVE: every output holds all ``n`` completions so far;
- DELTA: only the completions that advanced in this step, each holding what is new;
- FINAL_ONLY: a single output once all ``n`` are finished.

``finished`` is true when all children are. Prompt logprobs (computed by child 0
only) come with every output, or, for DELTA, with the first one that has them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from minivllm.engine.detokenizer import FinalDetokenizer, IncrementalDetokenizer
from minivllm.outputs import CompletionOutput, EngineCoreOutput, Logprob, Logprobs, RequestOutput
from minivllm.request import RequestId
from minivllm.sampling_params import RequestOutputKind, SamplingParams


@dataclass(eq=False)
class CompletionState:
    """One completion (one core request): its tokens, text and what was last reported."""

    request_id: RequestId
    index: int
    parent: "ParentRequest"
    detokenizer: IncrementalDetokenizer | FinalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: Logprobs | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    sent_tokens: int = 0
    sent_chars: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append_output(self, core_out: EngineCoreOutput) -> bool:
        """Take one step's new tokens; True when a stop string just ended the completion
        (the caller must then abort the core request).

        A step may bring several tokens (accepted drafts, multi-step decoding). A stop string
        that ends at one of them ends the completion there, as it would have one token a
        step: the tokens after it are dropped (and their logprobs), and it finishes "stop"
        unless the core finished the request at that same token."""
        new, finish, reason = core_out.new_token_ids, core_out.finish_reason, core_out.stop_reason
        stop = self.detokenizer.append(new)
        if stop is not None:
            kept = self.detokenizer.num_tokens - len(self.token_ids)  # through the stop string's last token
            if finish is None or kept < len(new):
                new, finish, reason = new[:kept], "stop", stop
        self.token_ids.extend(new)
        if core_out.new_logprobs is not None:
            logprobs = core_out.new_logprobs[: len(new)]
            self.logprobs = (self.logprobs or []) + logprobs
            chosen = [lp[t] for t, lp in zip(new, logprobs)]
            self.cumulative_logprob = (self.cumulative_logprob or 0.0) + sum(chosen)
        self.finish_reason, self.stop_reason = finish, reason
        if core_out.kv_transfer_params is not None:
            self.parent.kv_transfer_params = core_out.kv_transfer_params
        return stop is not None and core_out.finish_reason is None

    def output(self, delta: bool) -> CompletionOutput:
        text = self.detokenizer.output_text(self.finished)
        token_ids, logprobs = self.token_ids, self.logprobs
        if delta:
            text, token_ids = text[self.sent_chars :], token_ids[self.sent_tokens :]
            logprobs = logprobs[self.sent_tokens :] if logprobs is not None else None
            self.sent_chars, self.sent_tokens = self.sent_chars + len(text), len(self.token_ids)
        return CompletionOutput(
            index=self.index,
            text=text,
            token_ids=list(token_ids),
            cumulative_logprob=self.cumulative_logprob,
            logprobs=list(logprobs) if logprobs is not None else None,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )


@dataclass(eq=False)
class ParentRequest:
    request_id: RequestId
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    children: list[CompletionState] = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    first_token_time: float | None = None
    num_cached_tokens: int = 0
    """From the first core output (child 0 or whichever came first)."""
    num_unfinished: int = 0
    """Children not finished yet (the engine counts them down)."""
    kv_transfer_params: dict[str, Any] | None = None
    """From a finished child's last output (a KV connector's, see ``RequestOutput``)."""
    _prompt_logprobs_sent: bool = False

    def __post_init__(self) -> None:
        self.num_unfinished = self.params.n
        self.final_only = self.params.output_kind == RequestOutputKind.FINAL_ONLY

    def child_id(self, index: int) -> RequestId:
        return self.request_id if self.params.n == 1 else RequestId(f"{index}_{self.request_id}")

    def child_params(self, index: int) -> SamplingParams:
        if self.params.n == 1:
            return self.params
        params = self.params.clone()
        if params.seed is not None:
            params.seed += index
        if index > 0:
            params.prompt_logprobs = None  # the same for every child: child 0 computes them
        return params

    @property
    def finished(self) -> bool:
        return self.num_unfinished == 0

    def note_first_output(self, core_out: EngineCoreOutput) -> None:
        """A child's first output: the request's first-token time and cached prompt tokens (from
        whichever child came first), and the prompt logprobs (child 0's)."""
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
            self.num_cached_tokens = core_out.num_cached_tokens
        if core_out.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = core_out.prompt_logprobs

    def make_output(self, advanced: list[CompletionState]) -> RequestOutput | None:
        """The output for this step, given the completions that advanced in it."""
        finished = self.finished
        kind = self.params.output_kind
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        delta = kind == RequestOutputKind.DELTA
        shown = sorted(advanced, key=lambda c: c.index) if delta else self.children
        prompt_logprobs = self.prompt_logprobs
        if delta:
            prompt_logprobs = None if self._prompt_logprobs_sent else prompt_logprobs
            self._prompt_logprobs_sent = prompt_logprobs is not None or self._prompt_logprobs_sent
        metrics = {"arrival_time": self.arrival_time, "first_token_time": self.first_token_time or 0.0}
        if finished:
            metrics["finished_time"] = time.monotonic()
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[c.output(delta) for c in shown],
            finished=finished,
            prompt_logprobs=list(prompt_logprobs) if prompt_logprobs is not None else None,
            metrics=metrics,
            num_cached_tokens=self.num_cached_tokens,
            kv_transfer_params=self.kv_transfer_params,
        )
