"""From a parsed body to queued engine requests: every check a request passes before the
engine sees it, in the order a handler runs them.

1. **Caps, before any work** (``admit``, ``check_text_length``), so a refused request
   costs nothing:

   - ``n`` above ``serve.max_n``: 400 (the engine's ``Processor`` applies the same
     cap, so ``LLM`` refuses it too);
   - prompts x ``n`` above ``serve.max_seqs_per_request``: 400;
   - more unfinished sequences than ``scheduler.max_num_seqs + serve.max_waiting``
     once this request is added: 503 with ``Retry-After``; nothing is queued;
   - a text longer than ``max_model_len`` tokens could ever be: 400 before any of it
     is tokenized. No token of the tokenizer is longer than ``ServerState.max_token_chars``
     characters, so a text of more than ``max_model_len * max_token_chars`` characters
     has more than ``max_model_len`` tokens (vLLM's renderer bounds prompts the same
     way). Skipped when ``truncate_prompt_tokens`` keeps only the end of the prompt.

   The body's size (``serve.max_request_bytes``) is capped before it is even read
   (``app.BodyLimits``).
2. **Chat media fetched, then messages rendered** (``fetch_media``, ``render_messages``): the
   one place media enters the server. Images a request could not use are refused before
   anything is fetched (no chat template, a model that takes no images, more than
   ``model.limit_mm_per_prompt``; a request without the key never gets here, see
   ``app._Auth``). Then its http(s) image URLs are fetched concurrently on the event loop,
   under the server's ``MediaConnector`` (``multimodal/fetch.py``'s rules: public addresses
   unless named in ``serve.allowed_media_domains``, one deadline, a per-server cap on
   fetches in flight), and the template is rendered on the tokenizer thread with the
   bodies in hand (``data:`` and ``file:`` URLs are read there): the tokenizer thread
   never waits on the network.
3. **Each prompt tokenized and checked** by the engine's rules (``EngineRequests.add``,
   through ``AsyncLLM.process``), then **all started, or none** (``EngineRequests.start``):
   any refusal aborts the ones already started and becomes a 400 before a byte is
   streamed.

Tokenizing and rendering run on one worker thread (``off_loop``), never on the event
loop, so a long prompt does not stall other clients or ``/health``. What is admitted is
then scheduled fairly across client requests by the scheduler's waiting queue
(``core/request_queue.py``).
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

from minivllm.context_length import ContextLengthExceeded, Subject, check_request_fits, served_message
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.processor import ProcessedRequest
from minivllm.engine.request_stream import RequestStream
from minivllm.entrypoints.chat_utils import image_urls, render_chat
from minivllm.lora_request import LoRARequest
from minivllm.multimodal.media import MediaConnector
from minivllm.sampling_params import SamplingParams
from minivllm.serve.errors import BadRequest, Overloaded, bad_request
from minivllm.serve.state import ServerState

T = TypeVar("T")

RETRY_AFTER_S = 1
"""Seconds a client is told to wait after a 503."""

_TOKENIZER_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minivllm-tokenize")
"""One thread: the tokenizer is never called from two threads at once, and requests are tokenized in order."""


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the tokenizer thread (tokenizing, rendering a chat template)."""
    return await asyncio.get_running_loop().run_in_executor(_TOKENIZER_THREAD, functools.partial(fn, *args, **kwargs))


# ---- 1. caps ------------------------------------------------------------------------------


def check_request_size(state: ServerState, n: int, num_prompts: int) -> None:
    """The 400s: ``n`` and prompts x ``n`` against the server's caps."""
    serve = state.cfg.serve
    if n > serve.max_n:
        raise BadRequest("n", f"n={n}: must be in [1, {serve.max_n}] (serve.max_n={serve.max_n})")
    seqs = n * num_prompts
    if seqs > serve.max_seqs_per_request:
        raise BadRequest(
            "n",
            f"n={n}: {num_prompts} prompt(s) x n = {seqs} sequences, more than one request may queue "
            f"(serve.max_seqs_per_request={serve.max_seqs_per_request})",
        )


def check_capacity(state: ServerState, num_seqs: int) -> None:
    """The 503: would ``num_seqs`` more sequences wait beyond ``serve.max_waiting``?"""
    unfinished = state.engine.get_num_unfinished_sequences()
    capacity = state.cfg.scheduler.max_num_seqs + state.cfg.serve.max_waiting
    if unfinished + num_seqs > capacity:
        raise Overloaded(
            f"the server is at capacity ({unfinished} sequences unfinished; it queues at most "
            f"scheduler.max_num_seqs + serve.max_waiting = {capacity}); retry after {RETRY_AFTER_S} s",
            retry_after=RETRY_AFTER_S,
        )


def admit(state: ServerState, n: int, num_prompts: int) -> None:
    check_request_size(state, n, num_prompts)
    check_capacity(state, n * num_prompts)


def check_text_length(state: ServerState, param: str, texts: Iterable[str], truncate: int | None = None) -> None:
    """400 naming ``param`` when ``texts`` together cannot fit the context, whatever their tokens."""
    if truncate is not None:
        return
    chars = sum(len(t) for t in texts)
    max_len, per_token = state.cfg.max_model_len, state.max_token_chars
    if chars > max_len * per_token:
        raise BadRequest(
            param,
            f"{param}: too long; {chars} characters are more than max_model_len={max_len} tokens can hold "
            f"(no token of this tokenizer is longer than {per_token} characters)",
        )


def prompt_texts(prompt: Any) -> list[str]:
    """The strings of a completion ``prompt`` or an embedding ``input`` (token ids hold none)."""
    if isinstance(prompt, str):
        return [prompt]
    return [p for p in prompt if isinstance(p, str)] if isinstance(prompt, list) else []


def message_texts(messages: Iterable[Any]) -> list[str]:
    """The text of chat messages (string content and text parts), as parsed models or dicts."""
    texts = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else m.content
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
                texts.append(text if isinstance(text, str) else "")
    return texts


def refuse_unknown_fields(request: Any) -> None:
    """A 400 naming the first field the route does not declare: nothing a client asked for is dropped."""
    if request.model_extra:
        name = sorted(request.model_extra)[0]
        raise BadRequest(name, f"{name}: unknown or unsupported request field; this server does not implement it")


# ---- 2. chat messages and their media ------------------------------------------------------


NO_TEMPLATE = (
    "messages: this model's tokenizer has no chat template; start the server with "
    "serve.chat_template=<a Jinja template or a file holding one> (vLLM: --chat-template), "
    "or use /v1/completions"
)


async def fetch_media(state: ServerState, messages: list[dict[str, Any]]) -> MediaConnector:
    """The server's connector holding the bodies of ``messages``' http(s) image URLs, fetched on
    the running loop; 400s naming ``messages`` before any fetch for images the request could
    not use, and for a refused, failed or late fetch."""
    if not state.chat_template:
        raise BadRequest("messages", NO_TEMPLATE)
    images = image_urls(messages)
    if not images:
        return await state.media.fetch_ahead([])
    mm = state.engine.processor.mm
    if mm is None:
        raise BadRequest("messages", f"messages: hold images, but {state.cfg.architecture} takes no images")
    try:
        mm.check_image_count(len(images), "messages")
        return await state.media.fetch_ahead(images)
    except ValueError as err:
        raise BadRequest("messages", str(err)) from None


def render_messages(
    state: ServerState,
    body: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    media: MediaConnector,
) -> dict[str, Any]:
    """The prompt text and ids (and images, as ``multi_modal_data``) the chat template makes of
    ``messages`` and ``tools``, as ``body`` (a chat or /tokenize request) asks: its
    ``add_generation_prompt``, ``continue_final_message``, ``chat_template_kwargs`` and
    ``add_special_tokens``. Images are loaded here from ``media`` (``fetch_media``'s: nothing
    is fetched); a 400 naming ``messages`` for any fault. It tokenizes: call it off the loop."""
    tokenizer = state.engine.tokenizer
    try:
        rendered = render_chat(
            tokenizer,
            messages,
            chat_template=state.chat_template,
            add_generation_prompt=body.add_generation_prompt and not body.continue_final_message,
            continue_final_message=body.continue_final_message,
            tools=tools,
            chat_template_kwargs=body.chat_template_kwargs,
            media=media,
        )
    except ValueError as err:
        raise BadRequest("messages", str(err)) from None
    if body.add_special_tokens:
        rendered["prompt_token_ids"] = tokenizer.encode(rendered["prompt"], add_special_tokens=True, verbose=False)
    return rendered


# ---- 3. the engine's checks, then all started or none --------------------------------------


@dataclass
class Prompt:
    text: str | None
    token_ids: list[int]
    request: ProcessedRequest
    """What ``EngineRequests.start`` queues."""


class EngineRequests:
    """The engine requests of one HTTP request, one per prompt (``<request_id>-<i>``, all of
    group ``request_id``), with the sampling params, priority and adapter they share."""

    def __init__(
        self,
        engine: AsyncLLM,
        request_id: str,
        params: SamplingParams,
        priority: int,
        lora_request: LoRARequest | None,
        *,
        max_tokens: int | None,
        prompt_field: str = "prompt",
    ) -> None:
        self.engine, self.request_id, self.params, self.priority = engine, request_id, params, priority
        self.lora_request = lora_request
        self.max_tokens = max_tokens
        """What the client sent: a value that cannot fit the context is refused (the engine would cap it)."""
        self.prompt_field = prompt_field
        """The body field the prompt came from, named in a 400 for its faults (``messages`` for chat)."""
        self.prompts: list[Prompt] = []

    def add(self, prompt: Any) -> Prompt:
        """The request for the next prompt, checked and tokenized by the engine's rules.
        It tokenizes: call it through ``off_loop``."""
        rename = {"prompt": self.prompt_field, "prompt_token_ids": self.prompt_field}
        subject: Subject = "messages" if self.prompt_field == "messages" else "prompt"
        engine, request_id = self.engine, f"{self.request_id}-{len(self.prompts)}"
        try:
            request = engine.process(request_id, prompt, self.params, self.priority, self.request_id, self.lora_request)
            ids = request.prompt_token_ids
            if self.max_tokens is not None:
                check_request_fits(len(ids), self.max_tokens, engine.cfg.max_model_len)
        except ContextLengthExceeded as err:
            raise bad_request(_served(err, subject), rename) from None
        except ValueError as err:
            raise bad_request(err, rename) from None
        self.prompts.append(Prompt(request.prompt, ids, request))
        return self.prompts[-1]

    async def start(self) -> list[RequestStream]:
        """Queue the checked request of every prompt; all of them, or none (a 400)."""
        streams: list[RequestStream] = []
        try:
            for p in self.prompts:
                streams.append(await self.engine.add_processed(p.request))
        except BaseException as err:
            for s in streams:
                s.abort()
            if isinstance(err, ValueError):
                raise bad_request(err, {"prompt": self.prompt_field}) from None
            raise
        return streams


def _served(err: ContextLengthExceeded, subject: Subject) -> ContextLengthExceeded:
    """The engine's refusal in the server's wording, which speaks of the route's ``subject``."""
    return ContextLengthExceeded(
        served_message(err, subject), err.param, err.num_prompt_tokens, err.completion, err.max_model_len
    )
