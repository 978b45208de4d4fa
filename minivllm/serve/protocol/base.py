"""What every request and response body of the API is made of.

Request bodies (``OpenAIModel``) refuse fields they do not declare: nothing a
client sends is dropped, and the OpenAPI schema says so
(``additionalProperties: false``). Numbers in them are JSON's: ``Int`` refuses
``true``, ``1.0`` and ``"1"``; ``Float`` refuses booleans. A response that
OpenAI gives an id and a creation time (``OpenAIResponse``) lists ``id``,
``object``, ``created`` and ``model`` first, in that order, as OpenAI does.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Optional

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict


def refuse_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("Input should be a valid number, not a boolean")
    return value


Int = Annotated[int, Strict()]
"""An integer as JSON writes it: ``true``, ``1.0`` and ``"1"`` are refused (OpenAI does too)."""
Float = Annotated[float, BeforeValidator(refuse_bool)]
"""A number (integers accepted), never a boolean."""


def null_is(default: Any) -> AfterValidator:
    """OpenAI's spec lets clients send ``null`` for ``n``, ``stream`` and ``echo``: it means the default."""
    return AfterValidator(lambda value: default if value is None else value)


class OpenAIModel(BaseModel):
    """A request body (or part of one): unknown fields are refused, never dropped."""

    model_config = ConfigDict(extra="forbid")


class OpenAIResponse(BaseModel):
    """The fields an OpenAI response object opens with; a subclass narrows ``object`` to its own
    constant (the field keeps its place)."""

    id: str
    object: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ErrorInfo(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: Optional[str] = None
    code: int = 400


class ErrorResponse(BaseModel):
    error: ErrorInfo
