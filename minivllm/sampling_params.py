"""SamplingParams: how one request is decoded (vLLM's field names and meanings).

Every field is checked in ``__post_init__``; a bad value raises ValueError naming
the field and its allowed range, before the request reaches the engine. Checks
that need the model (token ids inside the vocabulary, ``model.max_logprobs``)
are in ``engine/processor.py`` and also run before any work. ``RANGES`` states
every numeric field's bounds once, for these checks and for the server's schema.
"""

from __future__ import annotations

import math
from copy import deepcopy
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Optional

from minivllm.config.model import Range, check_range
from minivllm.structured_output_params import GuidedDecodingParams, StructuredOutputsParams

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
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token already in the output, in [-2, 2]."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it is in the output, in [-2, 2]."""
    repetition_penalty: float = 1.0
    """Divides positive (multiplies negative) logits of tokens in the prompt or output; > 0 (vLLM's bound)."""
    logit_bias: Optional[dict[int, float]] = None
    """Token id -> value added to its logit (clamped to [-100, 100])."""
    allowed_token_ids: Optional[list[int]] = None
    """Only these token ids may be generated."""
    bad_words: Optional[list[str]] = None
    """Words that are never generated (their last token is banned when the rest precedes it)."""
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
    detokenize: bool = True
    """Turn output tokens into text; False leaves ``text`` empty (token ids and logprobs still come)."""
    truncate_prompt_tokens: Optional[int] = None
    """Keep only the last k prompt tokens (k >= 1)."""
    logits_processors: Optional[list[Callable[..., Any]]] = None
    """Per-request callables ``(output_token_ids, logits) -> logits`` on the row's (vocab,) logits, run last."""
    structured_outputs: Optional[StructuredOutputsParams] = None
    """Constrain the output to a JSON schema, regex, choice list or grammar."""
    guided_decoding: Optional[GuidedDecodingParams] = None
    """vLLM's older name for ``structured_outputs`` (moved there on construction)."""
    extra_args: Optional[dict[str, Any]] = None
    """Arguments for extensions; ``kv_transfer_params``: where a KV connector finds the prompt's KV."""

    # Filled by the engine's processor from the tokenizer and model config (not user input).
    _all_stop_token_ids: set[int] = field(default_factory=set, init=False, repr=False, compare=False)
    """stop_token_ids plus EOS (unless ignore_eos): banned while min_tokens is not reached."""
    _bad_words_token_ids: list[list[int]] = field(default_factory=list, init=False, repr=False, compare=False)
    """``bad_words`` as token-id sequences."""

    def __post_init__(self) -> None:
        self.stop = _str_list("stop", self.stop)
        self.bad_words = _str_list("bad_words", self.bad_words) if self.bad_words is not None else None
        self.stop_token_ids = _int_list("stop_token_ids", self.stop_token_ids)
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = _int_list("allowed_token_ids", self.allowed_token_ids)
            if not self.allowed_token_ids:
                raise ValueError("allowed_token_ids=[]: must hold at least one token id (or be None)")
        if self.logit_bias is not None:
            self.logit_bias = _logit_bias(self.logit_bias)
        if isinstance(self.output_kind, str) and self.output_kind.upper() in RequestOutputKind.__members__:
            self.output_kind = RequestOutputKind[self.output_kind.upper()]  # from a config file or the CLI
        self._structured_outputs()
        self._validate()

    def _structured_outputs(self) -> None:
        """Accept the older ``guided_decoding`` and plain dicts (config files, JSON)."""
        if self.guided_decoding is not None:
            if self.structured_outputs is not None:
                raise ValueError("guided_decoding: give structured_outputs or guided_decoding, not both")
            self.structured_outputs = self.guided_decoding
            self.guided_decoding = None
        if self.structured_outputs is not None:
            self.structured_outputs = StructuredOutputsParams.from_dict(
                _plain(self.structured_outputs), "structured_outputs"
            )

    def _validate(self) -> None:
        for name in _INTS:
            _check_int(name, getattr(self, name), optional=name in _OPTIONAL_INTS)
        for name in _NUMBERS:
            _check_number(name, getattr(self, name))
        for name, allowed in RANGES.items():
            value = getattr(self, name)
            if value is not None:
                allowed.check(name, value)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens}: must be at most max_tokens={self.max_tokens}")
        if not isinstance(self.detokenize, bool):
            raise ValueError(f"detokenize={self.detokenize!r}: must be true or false")
        if not self.detokenize and self.stop:
            raise ValueError("stop: stop strings need detokenize=True (use stop_token_ids instead)")
        self._check_logits_processors()
        if self.extra_args is not None and not isinstance(self.extra_args, dict):
            raise ValueError(f"extra_args={self.extra_args!r}: must be a dict (or None)")
        if not isinstance(self.output_kind, RequestOutputKind):
            kinds = ", ".join(f"RequestOutputKind.{k.name}" for k in RequestOutputKind)
            raise ValueError(f"output_kind={self.output_kind!r}: must be one of {kinds}")

    def _check_logits_processors(self) -> None:
        procs = self.logits_processors
        if procs is None:
            return
        if not isinstance(procs, (list, tuple)) or not all(callable(f) for f in procs):
            raise ValueError("logits_processors: must be a list of callables (output_token_ids, logits) -> logits")
        self.logits_processors = list(procs)

    @property
    def needs_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    def clone(self) -> "SamplingParams":
        """A deep copy (vLLM's name): the engine fills in per-request fields on copies.
        Logits processors are shared, not copied (they may hold state the caller reads)."""
        memo = {id(f): f for f in self.logits_processors or []}
        return deepcopy(self, memo)


def _plain(value: Any) -> Any:
    """A GuidedDecodingParams as a StructuredOutputsParams; anything else unchanged."""
    if isinstance(value, GuidedDecodingParams):
        return StructuredOutputsParams(**{k: v for k, v in vars(value).items()})
    if hasattr(value, "items") and not isinstance(value, (dict, StructuredOutputsParams)):
        return dict(value.items())  # an OmegaConf node
    return value


_LOGPROBS = Range(low=-1, said="in [0, inf), or -1 (the whole vocabulary)")
RANGES: dict[str, Range] = {
    "n": Range(low=1),
    "temperature": Range(low=0.0),
    "top_p": Range(low=0.0, high=1.0, low_open=True),
    "top_k": Range(low=-1, said="-1 (disable), 0 (disable) or at least 1"),
    "min_p": Range(low=0.0, high=1.0),
    "presence_penalty": Range(low=-2.0, high=2.0),
    "frequency_penalty": Range(low=-2.0, high=2.0),
    "repetition_penalty": Range(low=0.0, low_open=True),  # vLLM's bound: above 0, no cap
    "max_tokens": Range(low=1),
    "min_tokens": Range(low=0),
    "logprobs": _LOGPROBS,
    "prompt_logprobs": _LOGPROBS,
    "truncate_prompt_tokens": Range(low=1),
}
"""Each numeric field's allowed values (None passes where the field is optional). The server's
request models declare the same bounds in its OpenAPI schema (``serve/protocol.py``)."""

_INTS = ("n", "top_k", "min_tokens", "max_tokens", "logprobs", "prompt_logprobs", "seed", "truncate_prompt_tokens")
_OPTIONAL_INTS = ("max_tokens", "logprobs", "prompt_logprobs", "seed", "truncate_prompt_tokens")
_NUMBERS = tuple(name for name in RANGES if name not in _INTS)
"""The numeric fields that are not integers (temperature, top_p, min_p, the penalties): finite numbers."""
_LOGIT_BIAS_LIMIT = 100.0


def _check_int(name: str, value: Any, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}={value!r}: must be a number (an integer{' or None' if optional else ''})")


def _check_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}={value!r}: must be a number")
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r}: must be a finite number")


def _str_list(name: str, value: Any) -> list[str]:
    """A string or a list of non-empty strings, as a list."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) and s for s in items):
        raise ValueError(f"{name}={value!r}: must be a non-empty string or a list of non-empty strings")
    return list(items)


def _int_list(name: str, value: Any) -> list[int]:
    """A list of token ids (ints >= 0); None means empty."""
    if value is None:
        return []
    ok = isinstance(value, (list, tuple, set)) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    )
    if not ok:
        raise ValueError(f"{name}={value!r}: must be a list of token ids (ints >= 0)")
    return list(value)


def _logit_bias(value: Any) -> dict[int, float]:
    """{token id: bias}, keys as ints (JSON gives strings), biases clamped to [-100, 100] as OpenAI and vLLM do."""
    if not isinstance(value, dict):
        raise ValueError(f"logit_bias={value!r}: must be a dict of token id -> bias")
    out = {}
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and key.strip().isdigit() else key
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"logit_bias: key {key!r} must be a token id (int >= 0)")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise ValueError(f"logit_bias[{key!r}]={bias!r}: must be a finite number (clamped to [-100, 100])")
        out[token] = max(-_LOGIT_BIAS_LIMIT, min(_LOGIT_BIAS_LIMIT, float(bias)))
    return out


@dataclass
class BeamSearchParams:
    """Parameters of ``LLM.beam_search`` (vLLM's names)."""

    beam_width: int
    """Beams kept per prompt (and sequences returned)."""
    max_tokens: int
    """Most tokens to generate per beam."""
    ignore_eos: bool = False
    """Keep beams going past EOS instead of finishing them."""
    temperature: float = 0.0
    """Only 0 (deterministic beam search) is supported."""
    length_penalty: float = 1.0
    """Finished beams are ranked by sum of logprobs / (generated length ** length_penalty), as transformers does."""
    include_stop_str_in_output: bool = False
    """Accepted for vLLM compatibility; beams stop on EOS only, so there is no stop string to keep."""

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            _check_int(name, getattr(self, name), optional=False)
            check_range(name, getattr(self, name), low=1)
        _check_number("length_penalty", self.length_penalty)
        _check_number("temperature", self.temperature)
        if self.temperature != 0.0:
            raise ValueError(f"temperature={self.temperature}: beam search supports only 0 (no sampling)")
