"""POST /v1/completions: one request per prompt, ``n`` completions each."""

from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

from fastapi import Request

from minivllm.engine.request_stream import RequestStream
from minivllm.outputs import CompletionOutput
from minivllm.sampling_params import RequestOutputKind
from minivllm.serve.admission import EngineRequests, Prompt, admit, check_text_length, off_loop, prompt_texts
from minivllm.serve.errors import BadRequest
from minivllm.serve.outputs import StreamUsage, event_stream, finished, merged, sse, usage
from minivllm.serve.params import structured_outputs_of, to_sampling_params
from minivllm.serve.protocol import (
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
)
from minivllm.serve.state import ServerState


async def create_completion(state: ServerState, body: CompletionRequest, raw: Request) -> Any:
    lora = state.check_model(body.model)
    _check_unsupported(body)
    raw_prompts = _prompt_list(body.prompt)
    admit(state, body.n, len(raw_prompts))
    for p in raw_prompts:  # each prompt gets its own context
        check_text_length(state, "prompt", prompt_texts(p), body.truncate_prompt_tokens)
    kind = RequestOutputKind.DELTA if body.stream else RequestOutputKind.FINAL_ONLY
    params = to_sampling_params(
        body,
        state.default_sampling_params,
        max_tokens=body.max_tokens,
        logprobs=body.logprobs,
        output_kind=kind,
        structured_outputs=structured_outputs_of(body),
    )
    if body.echo and body.logprobs is not None:  # the echoed prompt's logprobs come from prompt logprobs
        params.prompt_logprobs = max(params.prompt_logprobs or 0, body.logprobs)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    requests = EngineRequests(state.engine, request_id, params, body.priority, lora, max_tokens=body.max_tokens)
    await off_loop(_add_prompts, state, body, raw_prompts, requests)
    streams = await requests.start()
    fmt = _Formatter(state, body, requests.prompts)
    if body.stream:
        return event_stream(_stream(body, request_id, streams, fmt))
    outs = await finished(raw, streams)
    choices = [fmt.choice(i, c, out.prompt_logprobs) for i, out in enumerate(outs) for c in out.outputs]
    response = fmt.response(request_id, choices, usage(requests.prompts, outs))
    response.kv_transfer_params = outs[0].kv_transfer_params
    return response


def _add_prompts(state: ServerState, body: CompletionRequest, raw_prompts: list[Any], requests: EngineRequests) -> None:
    """Every prompt tokenized and checked, in one trip to the tokenizer thread."""
    for p in raw_prompts:
        requests.add(_encoded(state, p, body))


def _check_unsupported(body: CompletionRequest) -> None:
    if body.best_of is not None and body.best_of != body.n:
        raise BadRequest("best_of", f"best_of={body.best_of}: only best_of == n is supported")
    if body.stream_options is not None and not body.stream:
        raise BadRequest("stream_options", "stream_options: only allowed with stream=true")


def _encoded(state: ServerState, prompt: Any, body: CompletionRequest) -> Any:
    """A text prompt tokenized here when ``add_special_tokens`` is false (the engine adds them)."""
    if body.add_special_tokens or not isinstance(prompt, str):
        return prompt
    return {
        "prompt": prompt,
        "prompt_token_ids": state.engine.tokenizer.encode(prompt, add_special_tokens=False, verbose=False),
    }


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
        self.model = state.shown_model(body.model)
        """The name responses report: the adapter's when the request chose one."""

    def response(
        self, request_id: str, choices: list[CompletionChoice], usage: UsageInfo | None, created: int | None = None
    ) -> CompletionResponse:
        """``created``: a stream's one timestamp; default now."""
        stamp = {} if created is None else {"created": created}
        return CompletionResponse(id=request_id, model=self.model, choices=choices, usage=usage, **stamp)

    def choice(self, prompt_index: int, c: CompletionOutput, prompt_logprobs: Any = None) -> CompletionChoice:
        index = prompt_index * self.body.n + c.index
        text, echoed = c.text, None
        if self.body.echo and index not in self._echoed:
            self._echoed.add(index)
            prompt = self.prompts[prompt_index]
            echo = prompt.text if prompt.text is not None else self.state.detokenize(prompt.token_ids)
            text = echo + text
            if prompt_logprobs is not None:
                echoed = (prompt.token_ids, prompt_logprobs)
        logprobs = self._logprobs(index, c, echoed) if self.body.logprobs is not None else None
        shown = prompt_logprobs if self.body.prompt_logprobs is not None else None
        return CompletionChoice(
            index=index,
            text=text,
            logprobs=logprobs,
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
            prompt_logprobs=prompt_logprobs_json(shown),
        )

    def _logprobs(self, index: int, c: CompletionOutput, echoed: Any = None) -> CompletionLogProbs:
        """Per token: its text, logprob and alternatives; an echoed prompt's tokens come first
        (the very first has no logprob)."""
        out = CompletionLogProbs()
        offset = self._offsets.get(index, 0)
        pairs = list(zip(*echoed)) if echoed is not None else []
        for token_id, top in pairs + list(zip(c.token_ids, c.logprobs or [])):
            token = self.state.token_text(token_id)
            out.tokens.append(token)
            out.token_logprobs.append(top.get(token_id) if top is not None else None)
            ranked = sorted(top.items(), key=lambda kv: -kv[1]) if top is not None else None
            out.top_logprobs.append({self.state.token_text(t): lp for t, lp in ranked} if ranked else None)
            out.text_offset.append(offset)
            offset += len(token)
        self._offsets[index] = offset
        return out


async def _stream(
    body: CompletionRequest, request_id: str, streams: list[RequestStream], fmt: _Formatter
) -> AsyncIterator[str]:
    counted = StreamUsage(body, fmt.prompts)
    created = int(time.time())  # one for the whole stream, as OpenAI's chunks share theirs
    async for i, out in merged(streams):
        counted.count(out.outputs)
        shown = [c for c in out.outputs if c.text or c.token_ids or c.finish_reason is not None]
        choices = [fmt.choice(i, c, out.prompt_logprobs) for c in shown]
        if choices:
            yield sse(fmt.response(request_id, choices, counted.on_chunk(), created))
    if counted.at_end:
        yield sse(fmt.response(request_id, [], counted.so_far(), created))


def prompt_logprobs_json(prompt_logprobs: Any) -> Any:
    """vLLM's JSON shape: per prompt token, None or {token id: {logprob, rank, decoded_token}}."""
    if prompt_logprobs is None:
        return None
    return [
        None
        if entry is None
        else {t: {"logprob": float(lp), "rank": lp.rank, "decoded_token": lp.decoded_token} for t, lp in entry.items()}
        for entry in prompt_logprobs
    ]
