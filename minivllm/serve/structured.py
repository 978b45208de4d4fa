"""Request fields that constrain the output -> ``StructuredOutputsParams``.

OpenAI's ``response_format`` (``text``, ``json_object``, ``json_schema``) and vLLM's
extra fields (``structured_outputs``, and the older ``guided_json``,
``guided_regex``, ``guided_choice``, ``guided_grammar``). At most one may be set;
any error is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from minivllm.serve.params import BadRequest
from minivllm.structured_output import StructuredOutputsParams
from minivllm.structured_output.backend import check_grammar

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
