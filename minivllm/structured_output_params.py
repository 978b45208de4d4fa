"""What a request asks its output to match: a JSON schema, a regex, one of a list
of choices, an EBNF grammar, or any JSON object (vLLM's ``StructuredOutputsParams``).

Exactly one kind is set. ``key()`` names the grammar for the compile cache, so
requests that ask for the same constraint share one compiled grammar.

``SamplingParams`` carries it, so it sits at the bottom of the package graph beside
``sampling_params.py`` and imports nothing of the engine; the grammars themselves
are ``structured_output/``'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Optional, Union

KINDS = ("json", "regex", "choice", "grammar", "json_object")
GrammarKey = tuple[str, str]
"""(kind, spec): the kind and its canonical text (a schema as sorted JSON, a regex, ...)."""


@dataclass
class StructuredOutputsParams:
    json: Optional[Union[str, dict[str, Any]]] = None
    """A JSON schema (a dict, or its JSON text) the output must satisfy."""
    regex: Optional[str] = None
    """A regular expression the whole output must match."""
    choice: Optional[list[str]] = None
    """The output is exactly one of these strings."""
    grammar: Optional[str] = None
    """An EBNF grammar (GBNF-style, rule ``root``) the output must match."""
    json_object: Optional[bool] = None
    """The output is any JSON object."""
    disable_any_whitespace: bool = False
    """JSON without optional whitespace (compact separators)."""

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                f"structured_outputs: set exactly one of {', '.join(KINDS)}; got {', '.join(given) or 'none'}"
            )
        self._check_types()

    @property
    def kind(self) -> str:
        """Which of ``KINDS`` is set."""
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def _check_types(self) -> None:
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    self.json = json.loads(self.json)
                except json.JSONDecodeError as err:
                    raise ValueError(f"structured_outputs.json: not valid JSON ({err})") from None
            if not isinstance(self.json, dict):
                raise ValueError(
                    f"structured_outputs.json: must be a JSON schema object, got {type(self.json).__name__}"
                )
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name}={value!r}: must be a non-empty string")
        if self.choice is not None:
            ok = (
                isinstance(self.choice, (list, tuple))
                and self.choice
                and all(isinstance(c, str) and c for c in self.choice)
            )
            if not ok:
                raise ValueError(
                    f"structured_outputs.choice={self.choice!r}: must be a non-empty list of non-empty strings"
                )
            self.choice = list(self.choice)
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise ValueError(f"structured_outputs.json_object={self.json_object!r}: must be true or false")
        if not isinstance(self.disable_any_whitespace, bool):
            raise ValueError(
                f"structured_outputs.disable_any_whitespace={self.disable_any_whitespace!r}: must be a bool"
            )

    def key(self) -> GrammarKey:
        """The compile-cache key: the kind and its canonical spec."""
        if self.kind == "json":
            spec = json.dumps(self.json, sort_keys=True)
        elif self.kind == "choice":
            spec = json.dumps(self.choice)
        elif self.kind == "json_object":
            spec = ""
        else:
            spec = getattr(self, self.kind)
        compact = self.kind in ("json", "json_object") and self.disable_any_whitespace
        return (self.kind + (":compact" if compact else ""), spec)

    @classmethod
    def from_dict(cls, value: Any, field_name: str = "structured_outputs") -> "StructuredOutputsParams":
        """From a request's JSON object; an unknown key is an error naming it."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{field_name}: must be an object with one of {', '.join(KINDS)}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"{field_name}.{unknown[0]}: not supported; the supported keys are {', '.join(sorted(known))}"
            )
        return cls(**value)


@dataclass
class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM's older name for the same thing (``SamplingParams(guided_decoding=...)``)."""
