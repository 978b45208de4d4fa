"""vLLM's utility routes: POST /tokenize, POST /detokenize, GET /version, GET|POST /ping.

``/tokenize`` takes a ``prompt`` (``add_special_tokens`` defaults to true) or chat
``messages`` (rendered by the same chat template code as ``LLM.chat`` and
/v1/chat/completions; ``add_special_tokens`` defaults to false; with images, each
image's placeholder is expanded as generation expands it) and answers
``{"count", "max_model_len", "tokens", "token_strs"}``; ``/detokenize`` takes
``{"tokens": [...]}`` and answers ``{"prompt": text}``.
"""

from __future__ import annotations

from typing import Any, Optional

from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel

import minivllm
from minivllm.entrypoints.chat_utils import render_chat
from minivllm.multimodal.media import MediaConnector
from minivllm.serve.errors import DEAD_ENGINE_RETRY_AFTER_S
from minivllm.serve.generation import off_loop
from minivllm.serve.limits import check_text_length, message_texts
from minivllm.serve.params import BadRequest, refuse_unknown_fields
from minivllm.serve.protocol import OpenAIModel
from minivllm.serve.protocol.ranges import int_in
from minivllm.serve.state import ServerState


class TokenizeRequest(OpenAIModel):
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[dict[str, Any]]] = None
    add_special_tokens: Optional[bool] = None
    """Default: true for ``prompt``, false for ``messages`` (the template holds them)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None
    return_token_strs: bool = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeRequest(OpenAIModel):
    model: Optional[str] = None
    tokens: list[int_in("tokens")]


class DetokenizeResponse(BaseModel):
    prompt: str


def add_tokenize_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        state.check_model(body.model)
        refuse_unknown_fields(body)
        texts = [body.prompt] if body.prompt is not None else message_texts(body.messages or [])
        check_text_length(state, "prompt" if body.prompt is not None else "messages", texts)
        tokens = await off_loop(_token_ids, state, body)
        strs = state.engine.tokenizer.convert_ids_to_tokens(tokens) if body.return_token_strs else None
        max_len = state.cfg.max_model_len
        return TokenizeResponse(count=len(tokens), max_model_len=max_len, tokens=tokens, token_strs=strs)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        state.check_model(body.model)
        refuse_unknown_fields(body)
        vocab = len(state.engine.tokenizer)
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise BadRequest("tokens", f"tokens: {bad[:5]} outside the tokenizer's vocabulary [0, {vocab})")
        return DetokenizeResponse(prompt=state.detokenize(body.tokens))

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": minivllm.__version__}

    @app.api_route("/ping", methods=["GET", "POST"], response_class=Response)
    async def ping() -> Response:
        if state.engine.is_running:
            return Response(status_code=200)
        return Response(status_code=503, headers={"Retry-After": str(DEAD_ENGINE_RETRY_AFTER_S)})


def _token_ids(state: ServerState, body: TokenizeRequest) -> list[int]:
    tokenizer = state.engine.tokenizer
    if (body.prompt is None) == (body.messages is None):
        raise BadRequest("prompt", "prompt: give exactly one of prompt or messages")
    if body.prompt is not None:
        add_special = True if body.add_special_tokens is None else body.add_special_tokens
        return tokenizer.encode(body.prompt, add_special_tokens=add_special, verbose=False)
    try:
        rendered = render_chat(
            tokenizer,
            body.messages,
            chat_template=state.chat_template,
            add_generation_prompt=body.add_generation_prompt and not body.continue_final_message,
            continue_final_message=body.continue_final_message,
            tools=body.tools,
            chat_template_kwargs=body.chat_template_kwargs,
            media=MediaConnector(state.cfg.model.allowed_local_media_path),
        )
    except ValueError as err:
        raise BadRequest("messages", str(err)) from None
    ids = rendered["prompt_token_ids"]
    if body.add_special_tokens:
        ids = tokenizer.encode(rendered["prompt"], add_special_tokens=True, verbose=False)
    mm_data = rendered.get("multi_modal_data")
    return ids if mm_data is None else _expand_images(state, ids, mm_data)


def _expand_images(state: ServerState, ids: list[int], mm_data: dict[str, Any]) -> list[int]:
    """The ids with each image placeholder repeated to the image's token count, as the
    engine's front end expands them for generation."""
    mm = state.engine.processor.mm
    if mm is None:
        raise BadRequest("messages", f"messages: hold images, but {state.cfg.architecture} takes no images")
    try:
        return mm.process(ids, mm_data)[0]
    except ValueError as err:
        raise BadRequest("messages", str(err)) from None
