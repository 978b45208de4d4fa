"""The ``speculative`` config group (vLLM's ``speculative_config``).

Off by default (``method: null``). With ``method=ngram`` the scheduler proposes up
to ``num_speculative_tokens`` draft tokens per decoding request by prompt lookup
(``core/spec_decode.py``); with ``method=draft_model`` a smaller model of the same
tokenizer (``model``) proposes them in the worker (``draft_model.py``), with
``method=eagle`` a head reading the target's hidden states (``eagle.py``). Either
way the target model verifies them all in one forward pass, and the rejection
sampler keeps the longest prefix the target agrees with. (The files named are
in ``minivllm/worker/spec_decode/``; this schema only describes what they do.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from minivllm.config.model import check_choice, check_range

SPEC_METHODS = ("ngram", "draft_model", "eagle")
MODEL_METHODS = ("draft_model", "eagle")
"""Methods whose proposals come from a model run in the worker."""


@dataclass
class SpeculativeConfig:
    """Speculative decoding: a cheap proposer drafts tokens, the target model verifies them in one pass."""

    method: Optional[str] = None
    """Proposer: null (off), ngram (prompt lookup), draft_model (a small model) or eagle (a head on the target)."""
    model: Optional[str] = None
    """draft_model / eagle: checkpoint directory of the draft or head; with method null it implies draft_model."""
    draft_tensor_parallel_size: Optional[int] = None
    """draft_model / eagle: tensor parallelism of the draft; only 1 (null means 1)."""
    num_speculative_tokens: int = 3
    """Most draft tokens proposed per request and step."""
    prompt_lookup_min: Optional[int] = None
    """ngram: the shortest suffix of the sequence that is looked up earlier in it (null: as max, or 5)."""
    prompt_lookup_max: Optional[int] = None
    """ngram: the longest suffix looked up, the longest match winning (null: as min, or 5)."""

    def __post_init__(self) -> None:
        if self.method is None and self.model is not None:
            self.method = "draft_model"  # as vLLM: a draft model given without a method
        if self.method is None:
            return
        check_choice("speculative.method", self.method, SPEC_METHODS)
        check_range("speculative.num_speculative_tokens", self.num_speculative_tokens, low=1)
        if self.method == "ngram":
            self._resolve_lookup_range()
        self._check_draft_keys()

    def _resolve_lookup_range(self) -> None:
        """vLLM's defaults: one bound given stands for both; none given is 5..5."""
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        self.prompt_lookup_min = lo = lo if lo is not None else (hi if hi is not None else 5)
        self.prompt_lookup_max = hi = hi if hi is not None else lo
        check_range("speculative.prompt_lookup_min", lo, low=1)
        check_range("speculative.prompt_lookup_max", hi, low=1)
        if lo > hi:
            raise ValueError(f"speculative.prompt_lookup_min={lo} exceeds speculative.prompt_lookup_max={hi}")

    def _check_draft_keys(self) -> None:
        if self.method in MODEL_METHODS and not self.model:
            raise ValueError(f"speculative.model: is required with speculative.method={self.method} (a checkpoint)")
        if self.method not in MODEL_METHODS and self.model is not None:
            raise ValueError(
                f"speculative.model={self.model!r}: only used by speculative.method=draft_model or eagle, "
                f"not {self.method}; remove it"
            )
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            if self.method != "ngram" and getattr(self, key) is not None:
                raise ValueError(
                    f"speculative.{key}: only used by speculative.method=ngram, not {self.method}; remove it"
                )
        if self.draft_tensor_parallel_size not in (None, 1):
            raise ValueError(
                f"speculative.draft_tensor_parallel_size={self.draft_tensor_parallel_size}: only 1 is supported"
            )

    @property
    def enabled(self) -> bool:
        return self.method is not None

    @property
    def uses_model(self) -> bool:
        """Whether a draft model (or head) runs in the worker and sends its drafts back."""
        return self.method in MODEL_METHODS
