"""The numeric ranges request fields declare: the engine's own, stated once.

Each bound comes from the table of the params the field becomes
(``sampling_params.RANGES``, ``pooling.params.RANGES``), so the OpenAPI
schema (``minimum``, ``exclusiveMaximum``, ...) and the engine's checks cannot
drift apart. The request models enforce them when the body is parsed; a value
out of range is a 400 worded as the engine words it
(``temperature=-1: must be in [0.0, inf)``), through ``out_of_range``.
"""

from __future__ import annotations

from typing import Annotated, Any

import annotated_types
from pydantic import BeforeValidator, Strict

from minivllm.config.model import Range
from minivllm.pooling.params import RANGES as POOLING_RANGES
from minivllm.sampling_params import RANGES as SAMPLING_RANGES
from minivllm.serve.protocol.base import refuse_bool

TOKEN_ID = Range(low=0)
"""A token id; the top of the vocabulary depends on the model and is checked by the route."""

FIELD_RANGES: dict[str, Range] = {
    **SAMPLING_RANGES,
    **POOLING_RANGES,
    "max_completion_tokens": SAMPLING_RANGES["max_tokens"],
    "top_logprobs": SAMPLING_RANGES["logprobs"],
    "tokens": TOKEN_ID,
}
"""Request field -> its range. A field named as a params field has that field's range;
chat's ``max_completion_tokens`` and ``top_logprobs`` become ``max_tokens`` and ``logprobs``."""

OUT_OF_RANGE_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})
"""pydantic's error types for a value outside a declared bound."""


def _bounds(allowed: Range) -> list[Any]:
    bounds: list[Any] = []
    if allowed.low is not None:
        bounds.append(annotated_types.Gt(allowed.low) if allowed.low_open else annotated_types.Ge(allowed.low))
    if allowed.high is not None:
        bounds.append(annotated_types.Lt(allowed.high) if allowed.high_open else annotated_types.Le(allowed.high))
    return bounds


def int_in(field: str) -> Any:
    """A JSON integer (see ``base.Int``) within ``FIELD_RANGES[field]``."""
    return Annotated[(int, Strict(), *_bounds(FIELD_RANGES[field]))]


def number_in(field: str) -> Any:
    """A JSON number, never a boolean (see ``base.Float``), within ``FIELD_RANGES[field]``.
    The bounds come before the validator, so that pydantic states them in the schema."""
    return Annotated[(float, *_bounds(FIELD_RANGES[field]), BeforeValidator(refuse_bool))]


def out_of_range(error: dict[str, Any], param: str, where: str) -> str | None:
    """The engine's message for pydantic's ``error`` when it is a value outside ``param``'s range
    (``where``: the position inside it, e.g. ``[2]`` for a list item); else None."""
    if error.get("type") not in OUT_OF_RANGE_ERRORS or param not in FIELD_RANGES:
        return None
    return FIELD_RANGES[param].message(f"{param}{where}", error.get("input"))
