"""What completions and chat share: checking prompts, starting their requests and
collecting their outputs (streaming them: ``streaming.py``).

A handler first checks every request of its body (one per prompt, each
tokenized and checked once by ``AsyncLLM.process``), then starts them all; any
refusal aborts the ones already started and becomes a 400 before a byte is
streamed. Tokenizing runs on one worker thread (``off_loop``), never on the
event loop, so a long prompt does not stall other clients or ``/health``.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

from fastapi import Request

from minivllm.context_length import ContextLengthExceeded, Subject, check_request_fits, served_message
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.processor import ProcessedRequest
from minivllm.engine.request_stream import RequestStream
from minivllm.lora.request import LoRARequest
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.serve.errors import ClientDisconnected
from minivllm.serve.params import bad_request
from minivllm.serve.protocol import UsageInfo

T = TypeVar("T")
_TOKENIZER_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minivllm-tokenize")
"""One thread: the tokenizer is never called from two threads at once, and requests are tokenized in order."""


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the tokenizer thread (tokenizing, rendering a chat template)."""
    return await asyncio.get_running_loop().run_in_executor(_TOKENIZER_THREAD, functools.partial(fn, *args, **kwargs))


@dataclass
class Prompt:
    text: str | None
    token_ids: list[int]
    request: ProcessedRequest
    """What ``start_requests`` queues."""


def check_prompt(
    engine: AsyncLLM,
    request_id: str,
    prompt: Any,
    params: SamplingParams,
    priority: int,
    lora_request: LoRARequest | None = None,
    *,
    max_tokens: int | None,
    group_id: str | None = None,
    prompt_field: str = "prompt",
) -> Prompt:
    """The request for one prompt, checked and tokenized by the engine's rules (a 400 naming
    ``prompt_field`` for the prompt's faults); refuse a ``max_tokens`` the client sent that cannot
    fit the context (the engine would cap it). It tokenizes: call it through ``off_loop``."""
    rename = {"prompt": prompt_field, "prompt_token_ids": prompt_field}
    subject: Subject = "messages" if prompt_field == "messages" else "prompt"
    try:
        request = engine.process(request_id, prompt, params, priority, group_id, lora_request)
        ids = request.prompt_token_ids
        if max_tokens is not None:
            check_request_fits(len(ids), max_tokens, engine.cfg.max_model_len)
    except ContextLengthExceeded as err:
        raise bad_request(_served(err, subject), rename) from None
    except ValueError as err:
        raise bad_request(err, rename) from None
    return Prompt(request.prompt, ids, request)


def _served(err: ContextLengthExceeded, subject: Subject) -> ContextLengthExceeded:
    """The engine's refusal in the server's wording, which speaks of the route's ``subject``."""
    return ContextLengthExceeded(
        served_message(err, subject), err.param, err.num_prompt_tokens, err.completion, err.max_model_len
    )


async def start_requests(engine: AsyncLLM, prompts: list[Prompt], prompt_field: str = "prompt") -> list[RequestStream]:
    """Queue the checked request of every prompt; all of them, or none (a 400)."""
    streams: list[RequestStream] = []
    try:
        for p in prompts:
            streams.append(await engine.add_processed(p.request))
    except BaseException as err:
        for s in streams:
            s.abort()
        if isinstance(err, ValueError):
            raise bad_request(err, {"prompt": prompt_field}) from None
        raise
    return streams


async def final_outputs(streams: list[RequestStream]) -> list[RequestOutput]:
    """The last output of each stream (params with output_kind=FINAL_ONLY)."""

    async def last(stream: RequestStream) -> RequestOutput:
        async for out in stream:
            if out.finished:
                return out
        raise RuntimeError(f"{stream.request_id}: stream ended without a finished output")

    try:
        return list(await asyncio.gather(*(last(s) for s in streams)))
    finally:
        for s in streams:
            s.abort()


async def finished(request: Request, streams: list[RequestStream]) -> list[RequestOutput]:
    """The last output of each stream, unless the client hangs up first (ClientDisconnected)."""
    return await unless_disconnected(request, final_outputs(streams))


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Run ``work``; if the client hangs up first, cancel it (its ``finally`` aborts
    its requests) and raise ClientDisconnected."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})  # let its clean-up run; never raises
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def usage(prompts: list[Prompt], outputs: list[RequestOutput] = (), generated: int | None = None) -> UsageInfo:
    """Token counts: every prompt once, every completion's tokens (or ``generated``)."""
    n_prompt = sum(len(p.token_ids) for p in prompts)
    if generated is None:
        generated = sum(len(c.token_ids) for out in outputs for c in out.outputs)
    return UsageInfo(prompt_tokens=n_prompt, completion_tokens=generated, total_tokens=n_prompt + generated)
