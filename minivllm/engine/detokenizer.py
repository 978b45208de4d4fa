"""Incremental detokenization and stop strings.

Text grows by the tokenizer library's own streaming decoder
(``tokenizers.decoders.DecodeStream``), which holds back bytes that do not yet
form whole characters. Stop strings are searched only in the tail that could
contain a new match, so a stop string split across tokens is found the moment
its last piece arrives.
"""
from __future__ import annotations

from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerBase

from minivllm.sampling_params import SamplingParams


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, params: SamplingParams, prompt_token_ids: list[int]):
        self._backend = getattr(tokenizer, "_tokenizer", None) or getattr(tokenizer, "backend_tokenizer")
        self._vocab_size = self._backend.get_vocab_size(with_added_tokens=True)
        self._stream = DecodeStream(skip_special_tokens=params.skip_special_tokens)
        self._stops = params.stop
        self._keep_stop = params.include_stop_str_in_output
        self._max_stop_len = max((len(s) for s in self._stops), default=0)
        self.text = ""
        self._prime(prompt_token_ids)

    def _prime(self, prompt_token_ids: list[int]) -> None:
        """Feed the prompt's tail so the first output token is decoded in context
        (a leading space or a multi-byte character may begin in the prompt)."""
        for token in prompt_token_ids[-4:]:
            self._step(token)

    def _step(self, token: int) -> str:
        if not 0 <= token < self._vocab_size:
            return ""  # ids past the tokenizer's vocabulary (padded embedding rows) have no text
        return self._stream.step(self._backend, token) or ""

    def append(self, token_ids: list[int]) -> str | None:
        """Add new tokens; returns the matched stop string if one now appears."""
        for token in token_ids:
            before = len(self.text)
            self.text += self._step(token)
            if self._stops:
                stop = self._find_stop(before)
                if stop is not None:
                    return stop
        return None

    def _find_stop(self, new_text_start: int) -> str | None:
        search_from = max(0, new_text_start - self._max_stop_len + 1)
        for stop in self._stops:
            at = self.text.find(stop, search_from)
            if at != -1:
                self.text = self.text[: at + len(stop)] if self._keep_stop else self.text[:at]
                return stop
        return None
