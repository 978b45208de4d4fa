"""POST /v1/completions: one request per prompt, ``n`` completions each."""

from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator

from fastapi import Request

from minivllm.engine.request_stream import RequestStream
from minivllm.outputs import CompletionOutput
from minivllm.sampling_params import RequestOutputKind
from minivllm.serve.generation import Prompt, check_prompt, finished, off_loop, start_requests, usage
from minivllm.serve.limits import admit, check_text_length, prompt_texts
from minivllm.serve.params import BadRequest, to_sampling_params
from minivllm.serve.protocol import CompletionChoice, CompletionLogProbs, CompletionRequest
from minivllm.serve.state import ServerState
from minivllm.serve.streaming import StreamUsage, event_stream, merged, sse
from minivllm.serve.structured import structured_outputs_of


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
    prompts = await off_loop(_check_prompts, state, body, raw_prompts, params, lora, request_id)
    streams = await start_requests(state.engine, prompts)
    fmt = _Formatter(state, body, prompts)
    if body.stream:
        return event_stream(_stream(state, body, request_id, streams, fmt))
    outs = await finished(raw, streams)
    choices = [fmt.choice(i, c, out.prompt_logprobs) for i, out in enumerate(outs) for c in out.outputs]
    return state.completion_response(request_id, choices, usage(prompts, outs), body.model)


def _check_prompts(
    state: ServerState,
    body: CompletionRequest,
    raw_prompts: list[Any],
    params: Any,
    lora: Any,
    request_id: str,
) -> list[Prompt]:
    """Every prompt tokenized and checked, in one trip to the tokenizer thread."""
    return [
        check_prompt(
            state.engine,
            f"{request_id}-{i}",
            _encoded(state, p, body),
            params,
            body.priority,
            lora,
            max_tokens=body.max_tokens,
            group_id=request_id,
        )
        for i, p in enumerate(raw_prompts)
    ]


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
    state: ServerState, body: CompletionRequest, request_id: str, streams: list[RequestStream], fmt: _Formatter
) -> AsyncIterator[str]:
    counted = StreamUsage(body, fmt.prompts)
    created = int(time.time())  # one for the whole stream, as OpenAI's chunks share theirs
    async for i, out in merged(streams):
        counted.count(out.outputs)
        shown = [c for c in out.outputs if c.text or c.token_ids or c.finish_reason is not None]
        choices = [fmt.choice(i, c, out.prompt_logprobs) for c in shown]
        if choices:
            yield sse(state.completion_response(request_id, choices, counted.on_chunk(), body.model, created))
    if counted.at_end:
        yield sse(state.completion_response(request_id, [], counted.so_far(), body.model, created))


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
