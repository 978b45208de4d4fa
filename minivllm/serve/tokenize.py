"""vLLM's tokenizer routes: POST /tokenize, POST /detokenize, GET /tokenizer_info.

``/tokenize`` takes a ``prompt`` (``add_special_tokens`` defaults to true) or chat
``messages`` (rendered by the same chat template code as ``LLM.chat`` and
/v1/chat/completions; ``add_special_tokens`` defaults to false; with images, each
image's placeholder is expanded as generation expands it) and answers
``{"count", "max_model_len", "tokens", "token_strs"}``; ``/detokenize`` takes
``{"tokens": [...]}`` and answers ``{"prompt": text}``.

``/tokenizer_info`` is what a client needs to tokenize as the server does: lm-eval's
``tokenizer_backend=remote`` and other clients read it instead of downloading the
tokenizer: its class, special tokens, the chat template the server renders with
(``serve.chat_template`` when set) and the longest prompt plus output it takes
(``model_max_length``: the server's ``max_model_len``, not the tokenizer file's
nominal limit).
"""

from __future__ import annotations

from typing import Any, Optional

from minivllm.multimodal.media import MediaConnector
from minivllm.serve.admission import (
    check_text_length,
    fetch_media,
    message_texts,
    off_loop,
    refuse_unknown_fields,
    render_messages,
)
from minivllm.serve.errors import BadRequest
from minivllm.serve.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfoResponse,
)
from minivllm.serve.state import ServerState


async def create_tokenize(state: ServerState, body: TokenizeRequest) -> TokenizeResponse:
    state.check_model(body.model)
    refuse_unknown_fields(body)
    texts = [body.prompt] if body.prompt is not None else message_texts(body.messages or [])
    check_text_length(state, "prompt" if body.prompt is not None else "messages", texts)
    if (body.prompt is None) == (body.messages is None):
        raise BadRequest("prompt", "prompt: give exactly one of prompt or messages")
    media = await fetch_media(state, body.messages) if body.messages is not None else None
    tokens = await off_loop(_token_ids, state, body, media)
    strs = state.engine.tokenizer.convert_ids_to_tokens(tokens) if body.return_token_strs else None
    max_len = state.cfg.max_model_len
    return TokenizeResponse(count=len(tokens), max_model_len=max_len, tokens=tokens, token_strs=strs)


def create_detokenize(state: ServerState, body: DetokenizeRequest) -> DetokenizeResponse:
    state.check_model(body.model)
    refuse_unknown_fields(body)
    vocab = len(state.engine.tokenizer)
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise BadRequest("tokens", f"tokens: {bad[:5]} outside the tokenizer's vocabulary [0, {vocab})")
    return DetokenizeResponse(prompt=state.detokenize(body.tokens))


def tokenizer_info(state: ServerState) -> TokenizerInfoResponse:
    tok = state.engine.tokenizer
    names = ("bos", "eos", "pad", "unk")
    special = {f"{n}_token": _text(getattr(tok, f"{n}_token", None)) for n in names}
    ids = {f"{n}_token_id": getattr(tok, f"{n}_token_id", None) for n in names}
    add_bos = getattr(tok, "add_bos_token", None)
    return TokenizerInfoResponse(
        tokenizer_class=type(tok).__name__,
        vocab_size=len(tok),
        model_max_length=state.cfg.max_model_len,
        **special,
        **ids,
        additional_special_tokens=[_text(t) for t in getattr(tok, "additional_special_tokens", None) or []],
        add_bos_token=add_bos if isinstance(add_bos, bool) else None,
        chat_template=state.chat_template if isinstance(state.chat_template, str) else None,
    )


def _text(token: object) -> Optional[str]:
    """A special token as text (tokenizers hold ``AddedToken`` objects or strings)."""
    return None if token is None else str(token)


def _token_ids(state: ServerState, body: TokenizeRequest, media: MediaConnector | None) -> list[int]:
    if body.prompt is not None or media is None:
        add_special = True if body.add_special_tokens is None else body.add_special_tokens
        return state.engine.tokenizer.encode(body.prompt, add_special_tokens=add_special, verbose=False)
    rendered = render_messages(state, body, body.messages, body.tools, media)
    ids = rendered["prompt_token_ids"]
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
