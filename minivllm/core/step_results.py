"""After a step: its sampled tokens into their requests, the stop checks, and the outputs.

``StepResults`` is the half of the ``Scheduler`` that runs once per step after the
workers return (``update_from_output``); the scheduler inherits it. It reads the
scheduler state named in its annotations and finishes requests with the
scheduler's ``_finish``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minivllm.core.stop import check_stop, stop_reason
from minivllm.outputs import EngineCoreOutput, ModelRunnerOutput
from minivllm.request import Request, RequestId, RequestStatus

if TYPE_CHECKING:
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.core.scheduler_output import SchedulerOutput
    from minivllm.core.spec_decode import SpecDecodeScheduling
    from minivllm.structured_output.manager import StructuredOutputManager


class StepResults:
    """``Scheduler.update_from_output`` and its stop checks."""

    requests: dict[RequestId, Request]
    kv: KVCacheManager
    structured: StructuredOutputManager
    spec: SpecDecodeScheduling | None
    in_flight: set[RequestId] | None
    async_scheduling: bool
    num_generated_tokens: int
    _num_steps: int

    def _finish(self, request: Request, status: RequestStatus) -> None:
        raise NotImplementedError  # the Scheduler's: out of the queues, its blocks freed

    def update_from_output(self, sched: SchedulerOutput, output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """A step's sampled tokens into its requests; runs once per step, after the workers return.

        For each request that sampled it appends the new tokens (with speculative
        decoding: the accepted drafts, then the target's own token) up to the first
        one that finishes the request, runs the stop checks (``check_stop``: EOS
        unless ignored, stop token ids, ``max_tokens``; ``min_tokens`` holds the first
        two back) and advances a structured-output grammar, and reports the tokens as
        ``EngineCoreOutput``s.

        Async scheduling: the step being processed may be one behind the schedule. A
        request that sampled in step k had a placeholder for that token
        (``Request.num_output_placeholders``); the real token replaces it here and the
        stop checks run as usual. A request that finished in step k may also be in step
        k+1: it was finished and forgotten when step k's output was processed, so its
        step-k+1 token finds no request and is dropped, and the output is exactly the
        synchronous one. A new request that reuses the id meanwhile was added after
        step k+1 was scheduled (``Request.added_after_step`` against
        ``SchedulerOutput.step_id``), so the stale token is dropped for it too (the same
        holds for micro-batches in flight).

        A final-only request (``Request.final_output_only``) is reported with its first
        token and when it finishes; the tokens in between travel with the last output.
        """
        results = []
        num_generated = 0
        requests, logprobs, prompt_logprobs = self.requests, output.logprobs, output.prompt_logprobs
        pooler_output = output.pooler_output
        placeholder = 1 if self.async_scheduling else 0
        grammar, spec = self.structured.active, self.spec
        if spec is not None:
            spec.receive(output.spec_token_ids)
        if self.in_flight is not None:
            self.in_flight.difference_update(sched.num_scheduled_tokens)
        step_id = sched.step_id if sched.step_id is not None else self._num_steps + 1
        for req_id, new_tokens in output.sampled_token_ids.items():
            request = requests.get(req_id)
            if request is None or request.added_after_step >= step_id:
                continue  # finished or aborted meanwhile (its id may be a newer request's now)
            if placeholder:
                request.num_output_placeholders -= 1
            if len(new_tokens) == 1:  # a decode step: one token, appended whether or not it stops
                appended, token, output_ids = new_tokens, new_tokens[0], request.output_token_ids
                output_ids.append(token)
                # Most tokens cannot stop their request: no length reached, not EOS, no stop ids
                # (a cheap superset of check_stop's conditions; min_tokens is left to it).
                stoppable = (
                    len(output_ids) >= request.max_tokens
                    or token == request.eos_token_id
                    or request.sampling_params.stop_token_ids
                )
                finished = bool(stoppable) and self._stops(request, token)
                if grammar and not finished:
                    finished = self._check_grammar_end(request)
            else:
                appended, finished = self._append_output(request, new_tokens, grammar)
            num_generated += len(appended)
            if spec is not None:
                drafts = sched.scheduled_spec_decode_tokens.get(req_id)
                if drafts:
                    spec.after_step(self.kv, request, len(drafts), len(new_tokens))
            if request.final_output_only:
                if request.num_reported_tokens and not finished:
                    continue  # nobody reads it before the end
                appended = request.output_token_ids[request.num_reported_tokens :]
            request.num_reported_tokens += len(appended)
            results.append(
                EngineCoreOutput(
                    req_id,
                    appended,
                    logprobs.get(req_id) if logprobs else None,
                    request.status.finish_reason if finished else None,
                    request.stop_reason,
                    prompt_logprobs.get(req_id) if prompt_logprobs else None,
                    request.num_cached_tokens or 0,
                    pooler_output.get(req_id) if pooler_output else None,
                )
            )
        self.num_generated_tokens += num_generated
        return results

    def _append_output(self, request: Request, new_tokens: list[int], grammar: bool) -> tuple[list[int], bool]:
        """Append sampled tokens up to the first that finishes the request; returns those
        appended and whether the request finished."""
        appended = []
        for token in new_tokens:
            request.output_token_ids.append(token)
            appended.append(token)
            if self._stops(request, token) or (grammar and self._check_grammar_end(request)):
                return appended, True
        return appended, False

    def _stops(self, request: Request, token: int) -> bool:
        """Whether ``token``, the request's newest output, finishes it (``check_stop``);
        if it does, the request is finished here."""
        status = check_stop(request, token)
        if status is None:
            return False
        if status is RequestStatus.FINISHED_STOPPED:
            request.stop_reason = stop_reason(request, token)
        self._finish(request, status)
        return True

    def _check_grammar_end(self, request: Request) -> bool:
        """Advance the request's matcher; a grammar that reached its end finishes it ("stop"),
        one that failed to compile aborts it."""
        if self.structured.active and self.structured.accept_tokens(request):
            failed = self.structured.failed(request)
            self._finish(request, RequestStatus.FINISHED_ABORTED if failed else RequestStatus.FINISHED_STOPPED)
            return True
        return False
