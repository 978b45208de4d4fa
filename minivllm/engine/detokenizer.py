"""Token ids -> text: incremental detokenization and stop strings, the final text decoded
once, and the logprobs' token texts.

Text grows by the tokenizer library's own streaming decoder
(``tokenizers.decoders.DecodeStream``), which holds back bytes that do not yet
form whole characters. Stop strings are searched only in the tail that could
contain a new match, so a stop string split across tokens is found the moment
its last piece arrives.

While a request runs, the last ``len(longest stop) - 1`` characters are held back
from what is shown (``output_text``): they might be the start of a stop string
that must not appear in the output. Text once shown is therefore never taken back.

Added tokens (special tokens when ``skip_special_tokens=False``) are their own
segments of text; with ``spaces_between_special_tokens`` the segments are joined
by single spaces, as transformers' Python tokenizers do.

**Final text only** (``FinalDetokenizer``): text decoded once, when a request finishes, for
requests that show nothing before. A request that asks only for its final output (``RequestOutputKind.FINAL_ONLY``,
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

**Logprobs.** ``LogprobBuilder`` turns the workers' ``PositionLogprobs`` into
``{token_id: Logprob}`` with each token's rank and, when asked, its text.
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerBase

from minivllm.outputs import Logprob, PositionLogprobs
from minivllm.sampling_params import RequestOutputKind, SamplingParams

PRIME_TOKENS = 4
"""Prompt tokens decoded before the first output token, for its context."""
INVALID_PREFIX = "Invalid prefix encountered"
"""How ``DecodeStream.step`` reports that its window's text no longer starts as before."""


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, params: SamplingParams, prompt_token_ids: list[int]):
        self._backend = getattr(tokenizer, "_tokenizer", None) or tokenizer.backend_tokenizer
        self._vocab_size = self._backend.get_vocab_size(with_added_tokens=True)
        self._skip_special = params.skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=self._skip_special)
        self._segment_tokens = self._spaced_tokens(params)
        self._new_segment = False
        """The next ordinary text follows an added token: prefix a space."""
        self._any_text = False
        """Some text (prompt or output) came before: an added token gets a space before it."""
        self._stops = params.stop
        self._keep_stop = params.include_stop_str_in_output
        self._max_stop_len = max((len(s) for s in self._stops), default=0)
        self._hold_back = 0 if self._keep_stop else max(0, self._max_stop_len - 1)
        self._min_tokens = params.min_tokens
        self.num_tokens = 0
        """Output tokens seen."""
        self.text = ""
        self._enabled = params.detokenize
        """False for detokenize=False: only tokens are counted and the text stays empty."""
        if self._enabled:
            self._prime(prompt_token_ids)

    def _spaced_tokens(self, params: SamplingParams) -> dict[int, str]:
        """Added tokens that show in the text as their own space-separated segment."""
        if not params.spaces_between_special_tokens:
            return {}
        added = self._backend.get_added_tokens_decoder()
        return {i: t.content for i, t in added.items() if not (t.special and self._skip_special)}

    def _prime(self, prompt_token_ids: list[int]) -> None:
        """Feed the prompt's tail so the first output token is decoded in context
        (a leading space or a multi-byte character may begin in the prompt)."""
        for token in prompt_token_ids[-PRIME_TOKENS:]:
            self._step(token)

    def _step(self, token: int) -> str:
        if not 0 <= token < self._vocab_size:
            return ""  # ids past the tokenizer's vocabulary (padded embedding rows) have no text
        if token in self._segment_tokens:
            self._stream = DecodeStream(skip_special_tokens=self._skip_special)  # next segment starts afresh
            piece = (" " if self._any_text else "") + self._segment_tokens[token]
            self._new_segment = self._any_text = True
            return piece
        piece = self._stream_step(token)
        if piece and self._new_segment:
            piece, self._new_segment = " " + piece, False
        self._any_text = self._any_text or bool(piece)
        return piece

    def _stream_step(self, token: int) -> str:
        """One token through the streaming decoder. ``DecodeStream`` fails with "Invalid
        prefix" when the text of its window shrinks as a token arrives (byte-fallback
        pieces that are not valid UTF-8 can do that); the stream then starts afresh
        at this token, so the text already shown stays and the request goes on."""
        try:
            return self._stream.step(self._backend, token) or ""
        except Exception as err:  # tokenizers raises a plain Exception
            if not str(err).startswith(INVALID_PREFIX):
                raise
        self._stream = DecodeStream(skip_special_tokens=self._skip_special)
        return self._stream.step(self._backend, token) or ""

    def append(self, token_ids: list[int]) -> str | None:
        """Add new tokens; returns the matched stop string if one now appears.
        Stop strings count only from the token after the first ``min_tokens``."""
        if not self._enabled:
            self.num_tokens += len(token_ids)
            return None
        for token in token_ids:
            before = len(self.text)
            self.text += self._step(token)
            self.num_tokens += 1
            if self._stops and self.num_tokens > self._min_tokens:
                stop = self._find_stop(before)
                if stop is not None:
                    return stop
        return None

    def output_text(self, finished: bool) -> str:
        """The text to show: all of it once finished, else without the held-back tail."""
        if finished or not self._hold_back:
            return self.text
        return self.text[: max(0, len(self.text) - self._hold_back)]

    def _find_stop(self, new_text_start: int) -> str | None:
        """The earliest stop string that ends in the new text; trims the text at it."""
        search_from = max(0, new_text_start - self._max_stop_len + 1)
        found = [(at, stop) for stop in self._stops if (at := self.text.find(stop, search_from)) != -1]
        if not found:
            return None
        at, stop = min(found, key=lambda f: f[0])
        self.text = self.text[: at + len(stop)] if self._keep_stop else self.text[:at]
        return stop


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


class LogprobBuilder:
    """Turns the workers' ``PositionLogprobs`` into ``{token_id: Logprob}``.

    A worker's dict holds the chosen token first, then the top-k in descending
    order; when the chosen token is one of the top-k it appears once. The
    chosen token's rank comes from the worker; the top-k's are their order.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.tokenizer.decode([token_id])
        return text

    def entry(self, raw: PositionLogprobs, top_k: int, detokenize: bool) -> dict[int, Logprob]:
        """One position; ``top_k``: how many alternatives were asked for."""
        items = list(raw.token_logprobs.items())
        top = items[1:] if len(items) > top_k else items  # the chosen token is outside the top-k
        ranks = {t: r for r, (t, _) in enumerate(sorted(top, key=lambda kv: -kv[1]), start=1)}
        ranks[items[0][0]] = raw.rank
        return {t: Logprob(lp, ranks[t], self.token_text(t) if detokenize else None) for t, lp in items}

    def positions(
        self, raw: list[PositionLogprobs | None], top_k: int, detokenize: bool
    ) -> list[dict[int, Logprob] | None]:
        return [None if d is None else self.entry(d, top_k, detokenize) for d in raw]
