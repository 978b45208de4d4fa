"""Incremental detokenization and stop strings.

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
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerBase

from minivllm.sampling_params import SamplingParams

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
