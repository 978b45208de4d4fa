"""OpenAI request fields this server knows but does not implement, per route.

Clients and frameworks send some of OpenAI's fields with the value that asks for
nothing (``"store": false``, ``"audio": null``, ...). Each such field is declared
here with its OpenAI type and its neutral values: at ``null`` or a neutral value it
is accepted and has no effect; at any other value it is a 400 naming the field,
saying it is not implemented and which values are accepted. A field in no table
and declared nowhere else stays an unknown field (a 400 too). The neutral values
are OpenAI's documented defaults (API reference, "Create chat completion" and
"Create completion"):

- ``store``: false is the default (the completion is not stored);
- ``modalities``: ``["text"]`` is the default output;
- ``verbosity``: ``"medium"`` is the default;
- ``service_tier``: ``"auto"`` is the default, ``"default"`` the standard tier;
- ``metadata``: an empty map attaches nothing;
- ``suffix``: an empty string appends nothing;
- the others: only null (absent) asks for nothing.

The tables are the single place these fields live: ``with_unimplemented`` adds
them to a request model, so the OpenAPI schema lists them, typed, each with a
description saying it is accepted only at its neutral values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Optional, Union

from pydantic import AfterValidator, BaseModel, Field, create_model
from pydantic_core import PydanticCustomError


@dataclass(frozen=True)
class Unimplemented:
    """A known OpenAI field: its type, the values besides null that ask for nothing, what it asks for."""

    type: Any
    neutral: tuple[Any, ...]
    asks_for: str

    def accepted(self) -> str:
        """``not implemented (it asks for ...): accepted only as null or false, which ask for nothing``."""
        values = " or ".join(json.dumps(v) for v in (None, *self.neutral))
        return f"not implemented by this server (it asks for {self.asks_for}); accepted only as {values}, which ask for nothing"


CHAT: dict[str, Unimplemented] = {
    "audio": Unimplemented(dict[str, Any], (), "audio output"),
    "function_call": Unimplemented(Union[str, dict[str, Any]], (), "a legacy function call; tool_choice replaces it"),
    "functions": Unimplemented(list[dict[str, Any]], (), "legacy functions; tools replaces them"),
    "metadata": Unimplemented(dict[str, str], ({},), "tags for a stored completion"),
    "modalities": Unimplemented(list[str], (["text"],), "output modalities besides text"),
    "prediction": Unimplemented(dict[str, Any], (), "predicted output"),
    "prompt_cache_key": Unimplemented(str, (), "a prompt cache bucket"),
    "prompt_cache_retention": Unimplemented(str, (), "a prompt cache retention policy"),
    "reasoning_effort": Unimplemented(str, (), "a reasoning effort"),
    "service_tier": Unimplemented(str, ("auto", "default"), "a processing tier"),
    "store": Unimplemented(bool, (False,), "storing the completion"),
    "verbosity": Unimplemented(str, ("medium",), "an answer length"),
    "web_search_options": Unimplemented(dict[str, Any], (), "web search"),
}
"""/v1/chat/completions."""

COMPLETIONS: dict[str, Unimplemented] = {
    "suffix": Unimplemented(str, ("",), "text after the completion, to insert between"),
}
"""/v1/completions."""

MESSAGE: dict[str, Unimplemented] = {
    "annotations": Unimplemented(list[dict[str, Any]], ([],), "web search citations on a message"),
    "audio": Unimplemented(dict[str, Any], (), "an earlier audio answer"),
    "function_call": Unimplemented(dict[str, Any], (), "a legacy function call; tool_calls replaces it"),
    "refusal": Unimplemented(str, (), "a refusal message"),
}
"""A chat message's own fields: an OpenAI client's earlier answer, appended to the
conversation as it came back, carries them at null (``refusal``, ``audio``,
``function_call``) or empty (``annotations``). They never reach the chat template."""

EMBEDDINGS: dict[str, Unimplemented] = {}
"""/v1/embeddings: OpenAI's fields (``input``, ``model``, ``dimensions``, ``encoding_format``,
``user``) are all implemented."""

ALL = frozenset({*CHAT, *COMPLETIONS, *EMBEDDINGS})
"""Every field in a table: none reaches ``SamplingParams``."""


def _only_neutral(field: Unimplemented) -> AfterValidator:
    def check(value: Any) -> Any:
        # ``value == n`` with the type checked too: JSON's false is not 0 and 1 is not true
        if value is None or any(type(value) is type(n) and value == n for n in field.neutral):
            return value
        detail = f"{field.accepted()}; got {json.dumps(value)}"
        raise PydanticCustomError("not_implemented", "{detail}", {"detail": detail})

    return AfterValidator(check)


def with_unimplemented(base: type[BaseModel], table: dict[str, Unimplemented]) -> type[BaseModel]:
    """``base`` plus the fields of ``table``, each optional, default null, refused unless neutral."""
    fields = {
        name: (
            Annotated[Optional[field.type], _only_neutral(field)],
            Field(None, description=field.accepted().capitalize() + "."),
        )
        for name, field in table.items()
    }
    return create_model(base.__name__.lstrip("_"), __base__=base, __module__=base.__module__, **fields)
