"""The request bodies of /v1/completions and /v1/chat/completions.

Each is ``SamplingRequest`` (the shared sampling fields) plus its route's own
fields. A chat message's fields are handed to the chat template as they are;
only ``content`` is checked here (required, except on an assistant message that
carries ``tool_calls``). OpenAI's fields neither implements are declared in
``unimplemented.py`` (accepted only at their neutral values).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, model_validator

from minivllm.serve.protocol.base import Int, OpenAIModel, null_is
from minivllm.serve.protocol.ranges import int_in
from minivllm.serve.protocol.sampling import SamplingRequest
from minivllm.serve.protocol.unimplemented import CHAT, COMPLETIONS, MESSAGE, with_unimplemented

ROLES = ("system", "developer", "user", "assistant", "tool")


class _CompletionRequest(SamplingRequest):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: Optional[int_in("max_tokens")] = 16
    logprobs: Optional[int_in("logprobs")] = None
    echo: Annotated[Optional[bool], null_is(False)] = False
    add_special_tokens: bool = True
    """Add the tokenizer's special tokens (BOS) to text prompts."""
    best_of: Optional[Int] = None


CompletionRequest = with_unimplemented(_CompletionRequest, COMPLETIONS)


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
    Every field is handed to the chat template as it is, except those of ``MESSAGE``
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
        return self.model_dump(exclude_none=True, exclude=set(MESSAGE))


ChatMessage = with_unimplemented(_ChatMessage, MESSAGE)


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


ChatCompletionRequest = with_unimplemented(_ChatCompletionRequest, CHAT)
