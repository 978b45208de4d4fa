"""Request and response bodies of the OpenAI-compatible API (pydantic models), every route's.

What every body is made of:

- Request bodies (``OpenAIModel``) refuse fields they do not declare
  (``extra="forbid"``): nothing a client sends is dropped, an unknown field is a 400
  naming it, and the OpenAPI schema says so (``additionalProperties: false``). Only the
  fields in ``NO_OP_FIELDS`` are accepted and ignored (documented in docs/serving.md),
  and those in the ``UNIMPLEMENTED_*`` tables at their neutral values.
- Numbers in them are JSON's: ``Int`` refuses ``true``, ``1.0`` and ``"1"``; ``Float``
  refuses booleans. Numeric fields declare the bounds the engine enforces, read from
  its own tables (``FIELD_RANGES``), so the schema and the engine agree.
- A response that OpenAI gives an id and a creation time (``OpenAIResponse``) lists
  ``id``, ``object``, ``created`` and ``model`` first, in that order, as OpenAI does.
  Responses are what the server writes, never parsed from a client, so they accept
  whatever the server fills in.

In reading order: the building blocks, the ranges, OpenAI's unimplemented fields,
the sampling fields the two generation routes share, the bodies of
/v1/completions and /v1/chat/completions and their answers, then the smaller
routes' bodies (/v1/models, /v1/embeddings, /tokenize, /detokenize,
/tokenizer_info, the LoRA adapter routes).
"""

from __future__ import annotations

import dataclasses
import json
import time
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

import annotated_types
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError

from minivllm.config.model import Range
from minivllm.pooling.params import RANGES as POOLING_RANGES
from minivllm.sampling_params import RANGES as SAMPLING_RANGES
from minivllm.sampling_params import SamplingParams

# ---- building blocks --------------------------------------------------------------------


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


# ---- ranges: the engine's own, stated once ------------------------------------------------
# Each bound comes from the table of the params the field becomes (``sampling_params.RANGES``,
# ``pooling.params.RANGES``), so the OpenAPI schema (``minimum``, ``exclusiveMaximum``, ...) and
# the engine's checks cannot drift apart. The request models enforce them when the body is
# parsed; a value out of range is a 400 worded as the engine words it
# (``temperature=-1: must be in [0.0, inf)``), through ``out_of_range``.

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
    """A JSON integer (see ``Int``) within ``FIELD_RANGES[field]``."""
    return Annotated[(int, Strict(), *_bounds(FIELD_RANGES[field]))]


def number_in(field: str) -> Any:
    """A JSON number, never a boolean (see ``Float``), within ``FIELD_RANGES[field]``.
    The bounds come before the validator, so that pydantic states them in the schema."""
    return Annotated[(float, *_bounds(FIELD_RANGES[field]), BeforeValidator(refuse_bool))]


def out_of_range(error: dict[str, Any], param: str, where: str) -> str | None:
    """The engine's message for pydantic's ``error`` when it is a value outside ``param``'s range
    (``where``: the position inside it, e.g. ``[2]`` for a list item); else None."""
    if error.get("type") not in OUT_OF_RANGE_ERRORS or param not in FIELD_RANGES:
        return None
    return FIELD_RANGES[param].message(f"{param}{where}", error.get("input"))


# ---- OpenAI's fields this server knows but does not implement, per route ---------------------
# Clients and frameworks send some of OpenAI's fields with the value that asks for nothing
# (``"store": false``, ``"audio": null``, ...). Each such field is declared in a table below
# with its OpenAI type and its neutral values: at ``null`` or a neutral value it is accepted and
# has no effect; at any other value it is a 400 naming the field, saying it is not implemented
# and which values are accepted. A field in no table and declared nowhere else stays an unknown
# field (a 400 too). The neutral values are OpenAI's documented defaults (API reference,
# "Create chat completion" and "Create completion"):
#
# - ``store``: false is the default (the completion is not stored);
# - ``modalities``: ``["text"]`` is the default output;
# - ``verbosity``: ``"medium"`` is the default;
# - ``service_tier``: ``"auto"`` is the default, ``"default"`` the standard tier;
# - ``metadata``: an empty map attaches nothing;
# - ``suffix``: an empty string appends nothing;
# - the others: only null (absent) asks for nothing.
#
# The tables are the single place these fields live: ``with_unimplemented`` adds them to a
# request model, so the OpenAPI schema lists them, typed, each with a description saying it is
# accepted only at its neutral values.


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


UNIMPLEMENTED_CHAT: dict[str, Unimplemented] = {
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

UNIMPLEMENTED_COMPLETIONS: dict[str, Unimplemented] = {
    "suffix": Unimplemented(str, ("",), "text after the completion, to insert between"),
}
"""/v1/completions."""

UNIMPLEMENTED_MESSAGE: dict[str, Unimplemented] = {
    "annotations": Unimplemented(list[dict[str, Any]], ([],), "web search citations on a message"),
    "audio": Unimplemented(dict[str, Any], (), "an earlier audio answer"),
    "function_call": Unimplemented(dict[str, Any], (), "a legacy function call; tool_calls replaces it"),
    "refusal": Unimplemented(str, (), "a refusal message"),
}
"""A chat message's own fields: an OpenAI client's earlier answer, appended to the
conversation as it came back, carries them at null (``refusal``, ``audio``,
``function_call``) or empty (``annotations``). They never reach the chat template."""

UNIMPLEMENTED_EMBEDDINGS: dict[str, Unimplemented] = {}
"""/v1/embeddings: OpenAI's fields (``input``, ``model``, ``dimensions``, ``encoding_format``,
``user``) are all implemented."""

UNIMPLEMENTED = frozenset({*UNIMPLEMENTED_CHAT, *UNIMPLEMENTED_COMPLETIONS, *UNIMPLEMENTED_EMBEDDINGS})
"""Every field in a route's table: none reaches ``SamplingParams``."""


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


# ---- the sampling fields /v1/completions and /v1/chat/completions share ----------------------
# OpenAI's fields plus vLLM's extra sampling fields at the top level (``top_k``, ``min_p``,
# ``repetition_penalty``, ...). Every other public ``SamplingParams`` field is declared too,
# from the dataclass itself (``_with_sampling_fields``), so a field added to ``SamplingParams``
# works over HTTP, and appears in the OpenAPI schema, without touching this file. Those in
# ``SERVER_OWNED`` are never settable over HTTP.

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
    # structured outputs (params.structured_outputs_of): at most one of these
    response_format: Optional[dict[str, Any]] = None
    structured_outputs: Optional[dict[str, Any]] = None
    guided_json: Optional[Union[str, dict[str, Any]]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    priority: Int = 0
    """Scheduling priority (scheduler.policy=priority): lower runs first."""
    kv_transfer_params: Optional[dict[str, Any]] = None
    """Disaggregated prefill: a prefill server's ``kv_transfer_params`` (its answer's), so this
    server's KV connector loads the prompt's KV from there (``extra_args["kv_transfer_params"]``)."""


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


# ---- /v1/completions and /v1/chat/completions: the requests ---------------------------------
# Each is ``SamplingRequest`` plus its route's own fields and its table of unimplemented
# fields. A chat message's fields are handed to the chat template as they are; only
# ``content`` is checked here (required, except on an assistant message that carries
# ``tool_calls``).

ROLES = ("system", "developer", "user", "assistant", "tool")


class _CompletionRequest(SamplingRequest):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int_in("max_tokens")] = 16
    logprobs: Optional[int_in("logprobs")] = None
    echo: Annotated[Optional[bool], null_is(False)] = False
    add_special_tokens: bool = True
    """Add the tokenizer's special tokens (BOS) to text prompts."""
    best_of: Optional[Int] = None


CompletionRequest = with_unimplemented(_CompletionRequest, UNIMPLEMENTED_COMPLETIONS)


class ContentPart(OpenAIModel):
    """A content part: ``text`` or ``image_url`` (``{"url": ...}``). The chat renderer refuses the
    others naming their ``type`` (OpenAI's other parts' fields are declared so that it can)."""

    type: str
    text: Optional[str] = None
    image_url: Optional[dict[str, Any]] = None
    input_audio: Optional[dict[str, Any]] = None
    file: Optional[dict[str, Any]] = None


class _ChatMessage(OpenAIModel):
    """One message; ``content`` is required except on an assistant message with ``tool_calls``.
    Every field is handed to the chat template as it is, except those of ``UNIMPLEMENTED_MESSAGE``
    (``template_fields``)."""

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
    def _content_required(self) -> "_ChatMessage":
        tool_calls = self.tool_calls
        if self.content is None and not (self.role == "assistant" and tool_calls):
            allowed = " (or tool_calls)" if self.role == "assistant" else ""
            raise ValueError(f"a {self.role} message needs content{allowed}")
        return self

    def template_fields(self) -> dict[str, Any]:
        """What the chat template sees: the set fields, without the unimplemented ones."""
        return self.model_dump(exclude_none=True, exclude=set(UNIMPLEMENTED_MESSAGE))


ChatMessage = with_unimplemented(_ChatMessage, UNIMPLEMENTED_MESSAGE)


class _ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int_in("max_tokens")] = None
    max_completion_tokens: Optional[int_in("max_completion_tokens")] = None
    logprobs: bool = False
    top_logprobs: Optional[int_in("top_logprobs")] = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    safety_identifier: Optional[str] = None
    """OpenAI's end-user id (``user``'s successor): accepted, no effect."""
    add_special_tokens: bool = False
    """Add the tokenizer's special tokens on top of the template's text (the template usually holds them)."""


ChatCompletionRequest = with_unimplemented(_ChatCompletionRequest, UNIMPLEMENTED_CHAT)


# ---- /v1/completions and /v1/chat/completions: the answers -----------------------------------
# A streamed chat answer is ``ChatCompletionChunk``s whose ``DeltaMessage`` holds only what is
# new; ``PromptLogprobs`` is vLLM's JSON shape (one entry per prompt token, the first None).


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


class CompletionResponse(OpenAIResponse):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None
    kv_transfer_params: Optional[dict[str, Any]] = None
    """A ``kv_producer``'s (P2pConnector): where the prompt's KV waits for a decode server."""


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


class ChatCompletionResponse(OpenAIResponse):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Optional[UsageInfo] = None
    prompt_logprobs: Optional[PromptLogprobs] = None
    kv_transfer_params: Optional[dict[str, Any]] = None
    """A ``kv_producer``'s (P2pConnector): where the prompt's KV waits for a decode server."""


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


class ChatCompletionChunk(OpenAIResponse):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatStreamChoice]
    usage: Optional[UsageInfo] = None


# ---- /v1/models and the LoRA adapter routes ----------------------------------------------


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


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str


# ---- /v1/embeddings -----------------------------------------------------------------------


class _EmbeddingRequest(OpenAIModel):
    model: Optional[str] = None
    input: Union[str, list[str], list[Int], list[list[Int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int_in("dimensions")] = None
    user: Optional[str] = None
    """OpenAI's end-user id: accepted, no effect."""
    truncate_prompt_tokens: Optional[int_in("truncate_prompt_tokens")] = None
    add_special_tokens: bool = True
    normalize: Optional[bool] = None
    priority: Int = 0


EmbeddingRequest = with_unimplemented(_EmbeddingRequest, UNIMPLEMENTED_EMBEDDINGS)


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Union[list[float], str]


class EmbeddingResponse(OpenAIResponse):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    usage: UsageInfo


# ---- /tokenize, /detokenize, /tokenizer_info ---------------------------------------------


class TokenizeRequest(OpenAIModel):
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[dict[str, Any]]] = None
    add_special_tokens: Optional[bool] = None
    """Default: true for ``prompt``, false for ``messages`` (the template holds them)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None
    return_token_strs: bool = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeRequest(OpenAIModel):
    model: Optional[str] = None
    tokens: list[int_in("tokens")]


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfoResponse(BaseModel):
    tokenizer_class: str
    """The Hugging Face tokenizer class (``PreTrainedTokenizerFast``, ``LlamaTokenizerFast``, ...)."""
    vocab_size: int
    """Every token id, added tokens included (``len(tokenizer)``)."""
    model_max_length: int
    bos_token: Optional[str] = None
    eos_token: Optional[str] = None
    pad_token: Optional[str] = None
    unk_token: Optional[str] = None
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    unk_token_id: Optional[int] = None
    additional_special_tokens: list[str] = Field(default_factory=list)
    add_bos_token: Optional[bool] = None
    """Whether a text prompt gets the BOS token (``add_special_tokens``), when the tokenizer says."""
    chat_template: Optional[str] = None
