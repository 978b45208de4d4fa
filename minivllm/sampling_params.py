"""SamplingParams: how one request is decoded (vLLM's field names and meanings).

Every field is checked in ``__post_init__``; a bad value raises ValueError naming
the field and its allowed range, before the request reaches the engine.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from minivllm.config.validation import check_range

_GREEDY_EPS = 1e-5


class RequestOutputKind(Enum):
    CUMULATIVE = 0
    """Each output holds everything generated so far."""
    DELTA = 1
    """Each output holds only what is new since the last one."""
    FINAL_ONLY = 2
    """Only the finished output is returned."""


@dataclass
class SamplingParams:
    n: int = 1
    """Completions per prompt."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling: smallest set of tokens whose probability sums to top_p, in (0, 1]."""
    top_k: int = -1
    """Keep the k most likely tokens; -1 (or 0) keeps all."""
    min_p: float = 0.0
    """Drop tokens less likely than min_p times the most likely one, in [0, 1]."""
    seed: Optional[int] = None
    """Per-request seed: the same tokens whatever else is in the batch."""
    max_tokens: Optional[int] = 16
    """Most tokens to generate; None means up to max_model_len."""
    min_tokens: int = 0
    """Tokens to generate before EOS or stop tokens may end the request."""
    stop: list[str] = field(default_factory=list)
    """Strings that end generation (not included in the output unless include_stop_str_in_output)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Token ids that end generation."""
    ignore_eos: bool = False
    """Keep generating after the EOS token."""
    include_stop_str_in_output: bool = False
    """Keep the matched stop string in the text."""
    logprobs: Optional[int] = None
    """Return this many top logprobs per generated token (plus the chosen one)."""
    prompt_logprobs: Optional[int] = None
    """Return this many top logprobs per prompt token."""
    skip_special_tokens: bool = True
    """Leave special tokens out of the text."""
    spaces_between_special_tokens: bool = True
    """Put spaces around special tokens in the text."""
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    """What each streamed output holds."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    def _validate(self) -> None:
        check_range("n", self.n, low=1)
        check_range("temperature", self.temperature, low=0.0)
        check_range("top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        if self.top_k < -1:
            raise ValueError(f"top_k={self.top_k}: must be -1 (disable), 0 (disable) or at least 1")
        check_range("min_p", self.min_p, low=0.0, high=1.0)
        if self.max_tokens is not None:
            check_range("max_tokens", self.max_tokens, low=1)
        check_range("min_tokens", self.min_tokens, low=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens}: must be at most max_tokens={self.max_tokens}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop={self.stop!r}: must be a non-empty string or a list of non-empty strings")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids={self.stop_token_ids!r}: must be a list of token ids (ints >= 0)")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                check_range(name, value, low=0)
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r}: must be an int")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS
