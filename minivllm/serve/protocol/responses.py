"""The response bodies: completions, chat completions (whole and streamed), models.

These are what the server writes, never parsed from a client, so they accept
whatever the server fills in. A streamed chat answer is ``ChatCompletionChunk``s
whose ``DeltaMessage`` holds only what is new; ``PromptLogprobs`` is vLLM's JSON
shape (one entry per prompt token, the first None).
"""

from __future__ import annotations

import time
from typing import Literal, Optional, Union

from pydantic import BaseModel, Field

from minivllm.serve.protocol.base import OpenAIResponse, UsageInfo


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
