"""OpenAI request fields -> ``SamplingParams`` and its output constraint, and the 400 errors on the way.

Every request field whose name is a ``SamplingParams`` field is passed on
(type-checked against the dataclass's annotation), so new sampling fields work
over HTTP as soon as they exist. A declared OpenAI field the engine does not
have yet is refused with a 400 when set to anything but its neutral value, never
silently dropped (``NEUTRAL`` here; ``protocol.with_unimplemented`` checks OpenAI's
fields the server does not implement when the body is parsed, and they are skipped
here). A field nobody declared that is not a ``SamplingParams`` field is a 400
naming it.

The fields that constrain the output become ``StructuredOutputsParams``
(``structured_outputs_of``): OpenAI's ``response_format`` (``text``,
``json_object``, ``json_schema``) and vLLM's extra fields (``structured_outputs``,
and the older ``guided_json``, ``guided_regex``, ``guided_choice``,
``guided_grammar``). At most one may be set; any error is a 400 naming the field.
"""

from __future__ import annotations

import dataclasses
import typing
from functools import lru_cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

from minivllm.sampling_params import SamplingParams
from minivllm.serve.errors import BadRequest, bad_request
from minivllm.serve.protocol import SERVER_OWNED, UNIMPLEMENTED
from minivllm.structured_output import StructuredOutputsParams
from minivllm.structured_output.backend import check_grammar

# Request fields that are about the request, not about sampling.
NOT_SAMPLING = frozenset(
    {
        "kv_transfer_params",
        "model",
        "prompt",
        "messages",
        "stream",
        "stream_options",
        "echo",
        "user",
        "safety_identifier",
        "priority",
        "best_of",
        "max_completion_tokens",
        "top_logprobs",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template_kwargs",
        "max_tokens",
        "logprobs",
        "response_format",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "add_special_tokens",
    }
)
# Declared fields that mean "off" at these values (OpenAI's defaults).
NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": {}}


@lru_cache(maxsize=1)
def _sampling_fields() -> dict[str, Any]:
    hints = typing.get_type_hints(SamplingParams)
    return {f.name: hints[f.name] for f in dataclasses.fields(SamplingParams) if f.name not in SERVER_OWNED}


@lru_cache(maxsize=None)
def _adapter(tp: Any) -> TypeAdapter:
    return TypeAdapter(tp)


def to_sampling_params(request: Any, defaults: dict[str, Any] | None = None, **explicit: Any) -> SamplingParams:
    """SamplingParams from a parsed request; ``explicit`` values (already converted) win, except that
    ``defaults`` (the checkpoint's generation config) fill the fields the client did not send."""
    options = getattr(request, "stream_options", None)
    if options is not None and options.model_extra:
        name = sorted(options.model_extra)[0]
        raise BadRequest("stream_options", f"stream_options.{name}: not supported; the only option is include_usage")
    unset = _unset_defaults(request, defaults or {})
    fields = _sampling_fields()
    declared = set(type(request).model_fields)
    kwargs: dict[str, Any] = {}
    for name, value in request.model_dump().items():
        if name in NOT_SAMPLING or name in UNIMPLEMENTED or name in explicit or value is None:
            continue
        if name in fields:
            kwargs[name] = _check_type(name, value, fields[name])
        elif name in NEUTRAL and value == NEUTRAL[name]:
            continue
        elif name in declared:
            raise BadRequest(name, f"{name}={value!r}: not supported by this engine yet")
        else:
            raise BadRequest(name, f"{name}: unknown or unsupported request field; this server does not implement it")
    kwargs.update(explicit)
    kwargs.update(unset)
    transfer = getattr(request, "kv_transfer_params", None)
    if transfer is not None:
        kwargs["extra_args"] = {**(kwargs.get("extra_args") or {}), "kv_transfer_params": transfer}
    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError) as err:
        raise bad_request(ValueError(str(err))) from None


def _unset_defaults(request: Any, defaults: dict[str, Any]) -> dict[str, Any]:
    sent = request.model_fields_set
    if "max_completion_tokens" in sent:
        sent = sent | {"max_tokens"}
    return {name: value for name, value in defaults.items() if name not in sent}


def _check_type(name: str, value: Any, annotation: Any) -> Any:
    if name == "stop" and isinstance(value, str):
        value = [value]
    try:
        return _adapter(annotation).validate_python(value)
    except ValidationError as err:
        first = err.errors()[0]
        raise BadRequest(name, f"{name}={value!r}: {first['msg']}") from None


GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def structured_outputs_of(body: Any) -> StructuredOutputsParams | None:
    """The constraint a request asks for, or None."""
    given = {
        name: getattr(body, name) for name in (*GUIDED_FIELDS, "structured_outputs") if getattr(body, name) is not None
    }
    fmt = _response_format(body.response_format)
    if fmt is not None:
        given["response_format"] = fmt
    if len(given) > 1:
        names = sorted(given)
        raise BadRequest(names[1], f"{names[1]}: give only one of {', '.join(names)}")
    if not given:
        return None
    name, value = next(iter(given.items()))
    try:
        if name == "response_format":
            params = value
        elif name == "structured_outputs":
            params = StructuredOutputsParams.from_dict(value)
        else:
            params = StructuredOutputsParams(**{GUIDED_FIELDS[name]: value})
        check_grammar(params)
        return params
    except (ValueError, TypeError) as err:
        message = str(err).replace("structured_outputs.", f"{name}: ", 1) if name != "structured_outputs" else str(err)
        raise BadRequest(name, message) from None


def _response_format(fmt: Any) -> StructuredOutputsParams | None:
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise BadRequest("response_format", "response_format.json_schema: must be an object with a 'schema' object")
        # strict true or false: the schema is always enforced.
        try:
            return StructuredOutputsParams(json=spec.get("schema", {}))
        except ValueError as err:
            raise BadRequest("response_format", f"response_format.json_schema: {err}") from None
    raise BadRequest("response_format", f"response_format.type={kind!r}: must be one of text, json_object, json_schema")
