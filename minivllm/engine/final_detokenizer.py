"""Text decoded once, when a request finishes, for requests that show nothing before.

A request that asks only for its final output (``RequestOutputKind.FINAL_ONLY``,
what ``LLM.generate`` asks) and has no stop strings needs no text while it runs:
nothing reads it. Decoding token by token (``IncrementalDetokenizer``) would cost
one tokenizer call per token per step; this detokenizer only keeps the tokens
and decodes them in one call at the end::

    text = decode(prompt tail + output)[len(decode(prompt tail)):]

The prompt's tail gives the first output token its context, as the incremental
detokenizer's priming does. That one call gives exactly the incremental text
when the tokenizer's decoder only concatenates what each token spells
(``_CONCATENATING``: byte-level BPE, SentencePiece's metaspace and byte
fallback) and no token is an added token shown as its own segment. In every
other case (another decoder, an added token, an id past the vocabulary, text
ending in an unfinished character) the tokens are replayed through
``IncrementalDetokenizer``, so the text is what streaming would show. The one
exception: where byte pieces that are not valid UTF-8 made the streaming decoder
restart (``IncrementalDetokenizer._stream_step``), the one call gives the
tokenizer's own decoding of the tokens.
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase

from minivllm.engine.detokenizer import PRIME_TOKENS, IncrementalDetokenizer
from minivllm.sampling_params import RequestOutputKind, SamplingParams

_CONCATENATING = frozenset({"ByteLevel", "Metaspace", "ByteFallback", "Fuse", "Strip", "Replace"})
"""Decoder steps under which decoding a sequence equals joining the decoded pieces."""


def wants_final_text_only(params: SamplingParams) -> bool:
    """Whether a request's text is read only once it finished (no stop strings to watch)."""
    return params.output_kind == RequestOutputKind.FINAL_ONLY and params.detokenize and not params.stop


class FinalTextDecoder:
    """One tokenizer's one-shot decoding, with what it needs to know computed once."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self._backend: Tokenizer = getattr(tokenizer, "_tokenizer", None) or tokenizer.backend_tokenizer
        self._vocab_size = self._backend.get_vocab_size(with_added_tokens=True)
        self._special = {i: t.special for i, t in self._backend.get_added_tokens_decoder().items()}
        """Added token id -> whether it is special."""
        self._concatenates = _decoder_steps(json.loads(self._backend.to_str()).get("decoder")) <= _CONCATENATING

    def decode(self, prompt_tail: list[int], token_ids: list[int], params: SamplingParams) -> str:
        """The text ``IncrementalDetokenizer`` would end with after the tail and the tokens."""
        skip = params.skip_special_tokens
        ids = prompt_tail + token_ids
        if self._concatenates and not self._needs_replay(ids, params):
            prefix = self._backend.decode(prompt_tail, skip_special_tokens=skip)
            full = self._backend.decode(ids, skip_special_tokens=skip)
            if full.startswith(prefix) and not full.endswith("\ufffd"):
                return full[len(prefix) :]
        detok = IncrementalDetokenizer(self.tokenizer, params, prompt_tail)
        detok.append(token_ids)
        return detok.output_text(finished=True)

    def _needs_replay(self, ids: list[int], params: SamplingParams) -> bool:
        """Whether an id lies past the vocabulary or is an added token that the incremental
        detokenizer shows as its own segment (``IncrementalDetokenizer._spaced_tokens``)."""
        vocab, special = self._vocab_size, self._special
        if not params.spaces_between_special_tokens:
            return any(not 0 <= t < vocab for t in ids)
        skip = params.skip_special_tokens
        return any(not 0 <= t < vocab or (t in special and not (special[t] and skip)) for t in ids)


class FinalDetokenizer:
    """``IncrementalDetokenizer``'s interface for ``wants_final_text_only`` requests."""

    def __init__(self, decoder: FinalTextDecoder, params: SamplingParams, prompt_token_ids: list[int]):
        self._decoder, self._params = decoder, params
        self._prompt_tail = list(prompt_token_ids[-PRIME_TOKENS:])
        self._token_ids: list[int] = []
        self._text: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self._token_ids)

    def append(self, token_ids: list[int]) -> None:
        """Keep the tokens; there is no stop string to find."""
        self._token_ids.extend(token_ids)
        self._text = None

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self._decoder.decode(self._prompt_tail, self._token_ids, self._params)
        return self._text

    def output_text(self, finished: bool) -> str:
        return self.text


def _decoder_steps(decoder: dict | None) -> frozenset[str]:
    """The types of a tokenizer.json decoder's steps (a Sequence's members); {"none"} without one."""
    if decoder is None:
        return frozenset({"none"})
    steps = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    return frozenset(step.get("type", "unknown") for step in steps)
