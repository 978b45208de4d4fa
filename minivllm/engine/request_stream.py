"""One request's stream of outputs in the async front end.

The engine process always sends deltas. A stream turns them into what the
request's ``SamplingParams.output_kind`` asks for (deltas, everything so far, or
only the final output) and hands them to one consumer through an asyncio queue.
A consumer that stops early (a client that went away) calls ``abort()``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Callable

from minivllm.engine.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import RequestOutputKind, SamplingParams


class EngineDeadError(RuntimeError):
    """The engine process failed or exited; no request can make progress.

    ``str(err)`` is one line (what a client may be shown); ``detail`` keeps the
    whole report, a worker's traceback included (the engine client logs it once)."""

    def __init__(self, reason: str | None = None) -> None:
        self.detail = reason or "engine is not running"
        super().__init__(one_line(self.detail))


def one_line(reason: str) -> str:
    """A failure report without its traceback: its first words and its last line
    (``engine failed: Traceback ... RuntimeError: x`` -> ``engine failed: RuntimeError: x``)."""
    lines = [line.strip() for line in reason.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else reason
    head = lines[0].split("Traceback (most recent call last)")[0].strip()
    return f"{head} {lines[-1]}" if head and head != lines[-1] else lines[-1]


class RequestStream:
    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        abort: Callable[[str], None],
        arrival_time: float,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.arrival_time = arrival_time
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.num_generation_tokens = 0
        self.finished = False
        """The engine reported the last output (or the request was aborted)."""
        self._abort = abort
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._so_far: dict[int, CompletionOutput] = {}
        self._indices: set[int] = set()
        self._done = False
        self._prompt_logprobs = None
        """Sent by the engine with the first delta only; kept for CUMULATIVE and FINAL_ONLY outputs."""

    # ---- producer side (the AsyncLLM's event loop) -------------------------------------
    def put(self, delta: RequestOutput) -> None:
        """Take one delta from the engine; queue what the consumer should see."""
        delta.prompt, delta.prompt_token_ids = self.prompt, self.prompt_token_ids
        delta.metrics = self._metrics(delta.finished)
        self.finished = delta.finished
        self._indices.update(c.index for c in delta.outputs)
        kind = self.params.output_kind
        if kind == RequestOutputKind.DELTA:
            self._queue.put_nowait(delta)
            return
        self._prompt_logprobs = delta.prompt_logprobs or self._prompt_logprobs
        for c in delta.outputs:
            self._merge(c)
        if kind == RequestOutputKind.FINAL_ONLY and not delta.finished:
            return
        outputs = [_copy(self._so_far[i]) for i in sorted(self._so_far)]
        self._queue.put_nowait(dataclasses.replace(delta, outputs=outputs, prompt_logprobs=self._prompt_logprobs))

    def _merge(self, c: CompletionOutput) -> None:
        acc = self._so_far.get(c.index)
        if acc is None:
            self._so_far[c.index] = _copy(c)
            return
        acc.text += c.text
        acc.token_ids.extend(c.token_ids)
        if c.logprobs is not None:
            acc.logprobs = (acc.logprobs or []) + list(c.logprobs)
        if c.cumulative_logprob is not None:
            acc.cumulative_logprob = c.cumulative_logprob
        acc.finish_reason, acc.stop_reason = c.finish_reason, c.stop_reason

    def put_aborted(self) -> None:
        """End the stream: a last output, finished, with finish_reason 'abort'."""
        if self.finished:
            return
        ends = [CompletionOutput(i, "", [], None, None, finish_reason="abort") for i in sorted(self._indices) or [0]]
        self.put(RequestOutput(self.request_id, None, [], ends, finished=True))

    def _metrics(self, finished: bool) -> dict[str, float]:
        metrics = {"arrival_time": self.arrival_time, "first_token_time": self.first_token_time or 0.0}
        if finished:
            metrics["finished_time"] = self.last_token_time or self.arrival_time
        return metrics

    def fail(self, err: BaseException) -> None:
        self.finished = True
        self._queue.put_nowait(err)

    # ---- consumer side ---------------------------------------------------------------
    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        """The next output; StopAsyncIteration after the finished one."""
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._done = item.finished
        return item

    def abort(self) -> None:
        """Stop the request if it is still running (frees its KV blocks); a consumer
        still iterating gets a last output with finish_reason 'abort'."""
        if not self.finished:
            self._abort(self.request_id)


def _copy(c: CompletionOutput) -> CompletionOutput:
    return dataclasses.replace(
        c, token_ids=list(c.token_ids), logprobs=list(c.logprobs) if c.logprobs is not None else None
    )
