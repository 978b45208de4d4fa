"""The sampling fields /v1/completions and /v1/chat/completions share.

OpenAI's fields plus vLLM's extra sampling fields at the top level (``top_k``,
``min_p``, ``repetition_penalty``, ...). Every other public ``SamplingParams``
field is declared too, from the dataclass itself (``_with_sampling_fields``),
so a field added to ``SamplingParams`` works over HTTP, and appears in the
OpenAPI schema, without touching this file. Only the fields in
``NO_OP_FIELDS`` are accepted and ignored (documented in docs/serving.md);
those in ``SERVER_OWNED`` are never settable over HTTP. Numeric fields declare the
bounds the engine enforces (``ranges.py``), so the schema states them and a value
out of range is refused when the body is parsed.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, create_model

from minivllm.sampling_params import SamplingParams
from minivllm.serve.protocol.base import Float, Int, OpenAIModel, null_is
from minivllm.serve.protocol.ranges import int_in, number_in

NO_OP_FIELDS = ("user", "safety_identifier")
"""Accepted and documented as having no effect (OpenAI's end-user ids; the second on chat only)."""


SERVER_OWNED = frozenset({"output_kind", "guided_decoding", "logits_processors"})
"""``SamplingParams`` fields never settable over HTTP (the server sets them, or they are Python callables)."""


class StreamOptions(OpenAIModel):
    include_usage: bool = False
    """Send a last chunk (with no choices) carrying the request's token usage."""
    continuous_usage_stats: bool = False
    """Also put the usage so far on every chunk."""


class _SamplingRequest(OpenAIModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: Optional[str] = None
    n: Annotated[Optional[int_in("n")], null_is(1)] = 1
    temperature: Optional[number_in("temperature")] = None
    top_p: Optional[number_in("top_p")] = None
    seed: Optional[Int] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: Annotated[Optional[bool], null_is(False)] = False
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[number_in("presence_penalty")] = None
    frequency_penalty: Optional[number_in("frequency_penalty")] = None
    logit_bias: Optional[dict[str, Float]] = None
    user: Optional[str] = None
    # vLLM's extra sampling fields, accepted at the top level
    top_k: Optional[int_in("top_k")] = None
    min_p: Optional[number_in("min_p")] = None
    repetition_penalty: Optional[number_in("repetition_penalty")] = None
    min_tokens: Optional[int_in("min_tokens")] = None
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[list[Int]] = None
    include_stop_str_in_output: Optional[bool] = None
    skip_special_tokens: Optional[bool] = None
    spaces_between_special_tokens: Optional[bool] = None
    prompt_logprobs: Optional[int_in("prompt_logprobs")] = None
    truncate_prompt_tokens: Optional[int_in("truncate_prompt_tokens")] = None
    """Keep only the last k prompt tokens."""
    detokenize: Optional[bool] = None
    """False: token ids (and logprobs) only, the text stays empty."""
    # structured outputs (serve/structured.py): at most one of these
    response_format: Optional[dict[str, Any]] = None
    structured_outputs: Optional[dict[str, Any]] = None
    guided_json: Optional[Union[str, dict[str, Any]]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    priority: Int = 0
    """Scheduling priority (scheduler.policy=priority): lower runs first."""


def _with_sampling_fields(base: type[BaseModel]) -> type[BaseModel]:
    """``base`` plus every public ``SamplingParams`` field it does not declare (optional, default
    unset: ``params.to_sampling_params`` passes what is sent on by name and type-checks it)."""
    hints = typing.get_type_hints(SamplingParams)
    extra = {
        f.name: (Optional[hints[f.name]], None)
        for f in dataclasses.fields(SamplingParams)
        if not f.name.startswith("_") and f.name not in SERVER_OWNED and f.name not in base.model_fields
    }
    return create_model(base.__name__.lstrip("_"), __base__=base, __module__=__name__, **extra)


SamplingRequest = _with_sampling_fields(_SamplingRequest)
