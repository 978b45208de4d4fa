"""OpenAI request fields -> ``SamplingParams``, by name, and the 400 errors on the way.

Every request field whose name is a ``SamplingParams`` field is passed on
(type-checked against the dataclass's annotation), so new sampling fields work
over HTTP as soon as they exist. A declared OpenAI field the engine does not
have yet is refused with a 400 when set to anything but its neutral value, never
silently dropped (``NEUTRAL`` here; ``protocol/unimplemented.py`` checks OpenAI's
fields the server does not implement when the body is parsed, and they are skipped
here). A field nobody declared that is not a ``SamplingParams`` field is a 400
naming it.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from functools import lru_cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

from minivllm.sampling_params import SamplingParams
from minivllm.serve.protocol import SERVER_OWNED
from minivllm.serve.protocol.unimplemented import ALL as UNIMPLEMENTED

# Request fields that are about the request, not about sampling.
NOT_SAMPLING = frozenset(
    {
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


class BadRequest(ValueError):
    """A 400: ``param`` names the offending field."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


def refuse_unknown_fields(request: Any) -> None:
    """A 400 naming the first field the route does not declare: nothing a client asked for is dropped."""
    if request.model_extra:
        name = sorted(request.model_extra)[0]
        raise BadRequest(name, f"{name}: unknown or unsupported request field; this server does not implement it")


def param_of(message: str) -> str | None:
    """The field a ValueError names: messages here start with ``field=value:`` or ``field:``."""
    m = re.match(r"^([A-Za-z_][A-Za-z_0-9.\[\]]*)\s*[=:]", message)
    return m.group(1) if m else None


def bad_request(err: ValueError, rename: dict[str, str] | None = None) -> BadRequest:
    """Wrap an engine ValueError; ``rename`` maps engine names to request names (prompt -> messages)."""
    if isinstance(err, BadRequest):
        return err
    param = getattr(err, "param", None) or param_of(str(err))
    return BadRequest((rename or {}).get(param, param) if param else None, str(err))


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
