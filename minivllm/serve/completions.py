"""POST /v1/completions: one request per prompt, ``n`` completions each."""
from __future__ import annotations

import uuid
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from minivllm.engine.outputs import CompletionOutput
from minivllm.engine.request_stream import EngineDeadError, RequestStream
from minivllm.sampling_params import RequestOutputKind
from minivllm.serve.generation import (
    SSE_DONE,
    Prompt,
    check_prompt,
    continuous_usage,
    final_outputs,
    merged,
    sse,
    start_requests,
    unless_disconnected,
    usage,
)
from minivllm.serve.limits import admit
from minivllm.serve.params import BadRequest, to_sampling_params
from minivllm.serve.protocol import CompletionChoice, CompletionLogProbs, CompletionRequest
from minivllm.serve.state import ServerState
from minivllm.serve.structured import structured_outputs_of


async def create_completion(state: ServerState, body: CompletionRequest, raw: Request) -> Any:
    state.check_model(body.model)
    _check_unsupported(body)
    raw_prompts = _prompt_list(body.prompt)
    admit(state, body.n, len(raw_prompts))
    kind = RequestOutputKind.DELTA if body.stream else RequestOutputKind.FINAL_ONLY
    params = to_sampling_params(
        body, max_tokens=body.max_tokens, logprobs=body.logprobs, output_kind=kind,
        structured_outputs=structured_outputs_of(body),
    )  # fmt: skip
    prompts = [check_prompt(state.engine, p, body.max_tokens) for p in raw_prompts]
    request_id = f"cmpl-{uuid.uuid4().hex}"
    streams = await start_requests(state.engine, request_id, prompts, params, body.priority)
    fmt = _Formatter(state, body, prompts)
    if body.stream:
        return StreamingResponse(_stream(state, body, request_id, streams, fmt), media_type="text/event-stream")
    outs = await unless_disconnected(raw, final_outputs(streams))
    choices = [fmt.choice(i, c) for i, out in enumerate(outs) for c in out.outputs]
    return state.completion_response(request_id, choices, usage(prompts, outs))


def _check_unsupported(body: CompletionRequest) -> None:
    if body.suffix:
        raise BadRequest("suffix", "suffix: not supported")
    if body.best_of is not None and body.best_of != body.n:
        raise BadRequest("best_of", f"best_of={body.best_of}: only best_of == n is supported")
    if body.echo and body.logprobs is not None:
        raise BadRequest("echo", "echo: not supported together with logprobs (it needs prompt logprobs)")
    if body.stream_options is not None and not body.stream:
        raise BadRequest("stream_options", "stream_options: only allowed with stream=true")


def _prompt_list(prompt: Any) -> list[Any]:
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    if not prompt:
        raise BadRequest("prompt", "prompt: is empty; give a string, a list of strings or token ids")
    return list(prompt)


class _Formatter:
    """Choices with OpenAI's indices (prompt * n + completion) and logprobs."""

    def __init__(self, state: ServerState, body: CompletionRequest, prompts: list[Prompt]) -> None:
        self.state, self.body, self.prompts = state, body, prompts
        self._offsets: dict[int, int] = {}
        self._echoed: set[int] = set()

    def choice(self, prompt_index: int, c: CompletionOutput) -> CompletionChoice:
        index = prompt_index * self.body.n + c.index
        text = c.text
        if self.body.echo and index not in self._echoed:
            self._echoed.add(index)
            prompt = self.prompts[prompt_index]
            echo = prompt.text if prompt.text is not None else self.state.detokenize(prompt.token_ids)
            text = echo + text
        logprobs = self._logprobs(index, c) if self.body.logprobs is not None else None
        return CompletionChoice(
            index=index, text=text, logprobs=logprobs, finish_reason=c.finish_reason, stop_reason=c.stop_reason
        )

    def _logprobs(self, index: int, c: CompletionOutput) -> CompletionLogProbs:
        out = CompletionLogProbs()
        offset = self._offsets.get(index, 0)
        for token_id, top in zip(c.token_ids, c.logprobs or []):
            token = self.state.token_text(token_id)
            out.tokens.append(token)
            out.token_logprobs.append(top.get(token_id))
            ranked = sorted(top.items(), key=lambda kv: -kv[1])
            out.top_logprobs.append({self.state.token_text(t): lp for t, lp in ranked})
            out.text_offset.append(offset)
            offset += len(token)
        self._offsets[index] = offset
        return out


async def _stream(
    state: ServerState, body: CompletionRequest, request_id: str, streams: list[RequestStream], fmt: _Formatter
) -> AsyncIterator[str]:
    generated = 0
    every_chunk = continuous_usage(body)
    try:
        async for i, out in merged(streams):
            choices = []
            for c in out.outputs:
                generated += len(c.token_ids)
                if c.text or c.token_ids or c.finish_reason is not None:
                    choices.append(fmt.choice(i, c))
            if choices:
                so_far = usage(fmt.prompts, generated=generated) if every_chunk else None
                yield sse(state.completion_response(request_id, choices, so_far))
        if body.stream_options is not None and body.stream_options.include_usage:
            yield sse(state.completion_response(request_id, [], usage(fmt.prompts, generated=generated)))
    except EngineDeadError as err:
        yield sse(state.error_body(str(err), "engine_error", 503))
    yield SSE_DONE
