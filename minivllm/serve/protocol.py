"""Request and response bodies of the OpenAI-compatible API (pydantic models).

Requests accept OpenAI's fields plus vLLM's extra sampling fields at the top
level (``top_k``, ``min_p``, ``repetition_penalty``, ...). Every other public
``SamplingParams`` field is declared too, from the dataclass itself
(``_with_sampling_fields``), so a field added to ``SamplingParams`` works over
HTTP, and appears in the OpenAPI schema, without touching this file. Nothing
else is accepted (``extra="forbid"``): an unknown field is a 400 naming it, and
the schema says so (``additionalProperties: false``). Only the fields in
``NO_OP_FIELDS`` are accepted and ignored (documented in docs/serving.md).
"""

from __future__ import annotations

import dataclasses
import time
import typing
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, create_model, model_validator

from minivllm.sampling_params import SamplingParams


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("Input should be a valid number, not a boolean")
    return value


Int = Annotated[int, Strict()]
"""An integer as JSON writes it: ``true``, ``1.0`` and ``"1"`` are refused (OpenAI does too)."""
Float = Annotated[float, BeforeValidator(_no_bool)]
"""A number (integers accepted), never a boolean."""
ROLES = ("system", "developer", "user", "assistant", "tool")


NO_OP_FIELDS = ("user",)
"""Accepted and documented as having no effect (OpenAI's end-user id)."""


SERVER_OWNED = frozenset({"output_kind", "guided_decoding", "logits_processors"})
"""``SamplingParams`` fields never settable over HTTP (the server sets them, or they are Python callables)."""


class OpenAIModel(BaseModel):
    """A request body (or part of one): unknown fields are refused, never dropped."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(OpenAIModel):
    include_usage: bool = False
    """Send a last chunk (with no choices) carrying the request's token usage."""
    continuous_usage_stats: bool = False
    """Also put the usage so far on every chunk."""


class _SamplingRequest(OpenAIModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: Optional[str] = None
    n: Int = 1
    temperature: Optional[Float] = None
    top_p: Optional[Float] = None
    seed: Optional[Int] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    presence_penalty: Optional[Float] = None
    frequency_penalty: Optional[Float] = None
    logit_bias: Optional[dict[str, Float]] = None
    user: Optional[str] = None
    # vLLM's extra sampling fields, accepted at the top level
    top_k: Optional[Int] = None
    min_p: Optional[Float] = None
    repetition_penalty: Optional[Float] = None
    min_tokens: Optional[Int] = None
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[list[Int]] = None
    include_stop_str_in_output: Optional[bool] = None
    skip_special_tokens: Optional[bool] = None
    spaces_between_special_tokens: Optional[bool] = None
    prompt_logprobs: Optional[Int] = None
    truncate_prompt_tokens: Optional[Int] = None
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


class CompletionRequest(SamplingRequest):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[Int] = 16
    logprobs: Optional[Int] = None
    echo: bool = False
    add_special_tokens: bool = True
    """Add the tokenizer's special tokens (BOS) to text prompts."""
    best_of: Optional[Int] = None
    suffix: Optional[str] = None


class ContentPart(OpenAIModel):
    """A content part: ``text`` or ``image_url`` (``{"url": ...}``). The chat renderer refuses the
    others naming their ``type`` (OpenAI's other parts' fields are declared so that it can)."""

    type: str
    text: Optional[str] = None
    image_url: Optional[dict[str, Any]] = None
    input_audio: Optional[dict[str, Any]] = None
    file: Optional[dict[str, Any]] = None


class ChatMessage(OpenAIModel):
    """One message; ``content`` is required except on an assistant message with ``tool_calls``.
    Every field is handed to the chat template as it is."""

    role: Literal[ROLES]
    content: Optional[Union[str, list[ContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    """An assistant message's calls: ``[{"id", "type": "function", "function": {"name", "arguments"}}]``."""
    tool_call_id: Optional[str] = None
    """A tool message: the call it answers."""
    reasoning_content: Optional[str] = None
    """An assistant message's reasoning, for templates that show it."""

    @model_validator(mode="after")
    def _content_required(self) -> "ChatMessage":
        tool_calls = self.tool_calls
        if self.content is None and not (self.role == "assistant" and tool_calls):
            allowed = " (or tool_calls)" if self.role == "assistant" else ""
            raise ValueError(f"a {self.role} message needs content{allowed}")
        return self


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[Int] = None
    max_completion_tokens: Optional[Int] = None
    logprobs: bool = False
    top_logprobs: Optional[Int] = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    add_special_tokens: bool = False
    """Add the tokenizer's special tokens on top of the template's text (the template usually holds them)."""


# ---- responses ---------------------------------------------------------------------
class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's JSON form of one ``Logprob``."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


PromptLogprobs = list[Optional[dict[int, PromptLogprob]]]
"""One entry per prompt token (the first None): token id -> its logprob."""


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None
    prompt_logprobs: Optional[PromptLogprobs] = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None


class TopLogProb(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class ChatTokenLogProb(TopLogProb):
    top_logprobs: list[TopLogProb] = Field(default_factory=list)


class ChatLogProbs(BaseModel):
    content: Optional[list[ChatTokenLogProb]] = None


class FunctionCall(BaseModel):
    name: str
    arguments: str
    """The arguments as JSON text."""


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(BaseModel):
    name: Optional[str] = None
    arguments: Optional[str] = None


class DeltaToolCall(BaseModel):
    index: int
    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: DeltaFunctionCall


class ChatMessageOut(BaseModel):
    role: str = "assistant"
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: list[ToolCallOut] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Optional[UsageInfo] = None
    prompt_logprobs: Optional[PromptLogprobs] = None


class DeltaMessage(BaseModel):
    role: Optional[str] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[DeltaToolCall]] = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: Optional[UsageInfo] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "minivllm"
    root: Optional[str] = None
    parent: Optional[str] = None
    """For a LoRA adapter: the base model it runs on."""
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: Optional[str] = None
    code: int = 400


class ErrorResponse(BaseModel):
    error: ErrorInfo
