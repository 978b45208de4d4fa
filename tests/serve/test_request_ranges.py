"""The numeric ranges the request bodies declare (and so /openapi.json) are the engine's.

Every numeric ``SamplingParams`` field is declared with bounds by both generation
routes, and ``PoolingParams``' by /v1/embeddings. At each bound a schema states,
the request model and the params it becomes agree: the bound itself (or, for an
exclusive bound, the nearest value inside) is accepted by both, the nearest value
outside is refused by both, and the 400 the server makes of the model's refusal
is the engine's own message under the request's field name.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from minivllm.pooling.params import RANGES as POOLING_RANGES
from minivllm.pooling.params import PoolingParams
from minivllm.sampling_params import RANGES as SAMPLING_RANGES
from minivllm.sampling_params import SamplingParams
from minivllm.serve.errors import describe_validation
from minivllm.serve.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

BASE = {
    CompletionRequest: {"prompt": "x"},
    ChatCompletionRequest: {"messages": [{"role": "user", "content": "x"}]},
    EmbeddingRequest: {"input": "x"},
}
RENAMED = {
    (ChatCompletionRequest, "max_completion_tokens"): "max_tokens",
    (ChatCompletionRequest, "top_logprobs"): "logprobs",
}
"""Request fields that become a params field of another name."""


def _cases() -> list[tuple[type, str, type, str]]:
    """(request model, field, params class, params field) for every ranged params field."""
    cases = [(CompletionRequest, name, SamplingParams, name) for name in SAMPLING_RANGES]
    chat = [name for name in SAMPLING_RANGES if name != "logprobs"]  # chat's logprobs is a boolean
    cases += [(ChatCompletionRequest, name, SamplingParams, name) for name in chat]
    cases += [(ChatCompletionRequest, field, SamplingParams, name) for (_, field), name in RENAMED.items()]
    return cases + [(EmbeddingRequest, name, PoolingParams, name) for name in POOLING_RANGES]


CASES = _cases()


def _numeric_schema(model: type, field: str) -> dict[str, Any]:
    prop = model.model_json_schema()["properties"][field]
    branches = prop.get("anyOf", [prop])
    (numeric,) = [b for b in branches if b.get("type") in ("integer", "number")]
    return numeric


def _step(value: float, up: bool, integer: bool) -> float:
    if integer:
        return value + (1 if up else -1)
    return math.nextafter(value, math.inf if up else -math.inf)


def _boundary_values(schema: dict[str, Any]) -> list[tuple[float, bool]]:
    """(value, allowed) pairs at each bound the schema states: on and just past it."""
    integer = schema["type"] == "integer"
    pairs = []
    for key, up_is_inside, exclusive in (
        ("minimum", True, False),
        ("exclusiveMinimum", True, True),
        ("maximum", False, False),
        ("exclusiveMaximum", False, True),
    ):
        if key not in schema:
            continue
        bound = schema[key]
        inside = _step(bound, up_is_inside, integer) if exclusive else bound
        outside = bound if exclusive else _step(bound, not up_is_inside, integer)
        pairs += [(inside, True), (outside, False)]
    return pairs


@pytest.mark.parametrize(
    "model, field, params_cls, params_field", CASES, ids=[f"{m.__name__}.{f}" for m, f, *_ in CASES]
)
def test_each_declared_bound_agrees_with_the_engine(model, field, params_cls, params_field):
    schema = _numeric_schema(model, field)
    pairs = _boundary_values(schema)
    assert pairs, f"{model.__name__}.{field} declares no bound"
    for value, allowed in pairs:
        body = {**BASE[model], field: value}
        if allowed:
            model.model_validate(body)
            params_cls(**{params_field: value})
            continue
        with pytest.raises(ValidationError) as refused:
            model.model_validate(body)
        with pytest.raises(ValueError) as engine:
            params_cls(**{params_field: value})
        message, param = describe_validation(refused.value.errors())
        assert param == field
        assert message == str(engine.value).replace(f"{params_field}=", f"{field}=", 1)
