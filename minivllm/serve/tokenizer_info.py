"""GET /tokenizer_info: what a client needs to tokenize as the server does (vLLM's route).

lm-eval's ``tokenizer_backend=remote`` and other clients read it instead of
downloading the tokenizer: its class, special tokens, the chat template the
server renders with (``serve.chat_template`` when set) and the longest prompt
plus output it takes (``model_max_length``: the server's ``max_model_len``,
not the tokenizer file's nominal limit).
"""

from __future__ import annotations

from typing import Optional

from fastapi import FastAPI
from pydantic import BaseModel, Field

from minivllm.serve.state import ServerState


class TokenizerInfoResponse(BaseModel):
    tokenizer_class: str
    """The Hugging Face tokenizer class (``PreTrainedTokenizerFast``, ``LlamaTokenizerFast``, ...)."""
    vocab_size: int
    """Every token id, added tokens included (``len(tokenizer)``)."""
    model_max_length: int
    bos_token: Optional[str] = None
    eos_token: Optional[str] = None
    pad_token: Optional[str] = None
    unk_token: Optional[str] = None
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    unk_token_id: Optional[int] = None
    additional_special_tokens: list[str] = Field(default_factory=list)
    add_bos_token: Optional[bool] = None
    """Whether a text prompt gets the BOS token (``add_special_tokens``), when the tokenizer says."""
    chat_template: Optional[str] = None


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


def add_tokenizer_info_route(app: FastAPI, state: ServerState) -> None:
    info = tokenizer_info(state)  # fixed for the server's life

    @app.get("/tokenizer_info")
    async def get_tokenizer_info() -> TokenizerInfoResponse:
        return info
