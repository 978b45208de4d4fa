"""Request and response bodies of the OpenAI-compatible API (pydantic models).

- ``base``: what every body is made of: strict JSON numbers (``Int``, ``Float``),
  request bodies that refuse unknown fields (``OpenAIModel``), usage and the
  error body;
- ``sampling``: the sampling fields the two generation routes share, every public
  ``SamplingParams`` field among them;
- ``ranges``: the numeric bounds request fields declare, read from the engine's own
  tables (``sampling_params.RANGES``), so the schema and the engine agree;
- ``requests``: the bodies of /v1/completions and /v1/chat/completions;
- ``unimplemented``: OpenAI's fields the server knows but does not implement, per
  route, accepted only at the values that ask for nothing;
- ``responses``: what those routes and /v1/models answer.

Nothing undeclared is accepted (``extra="forbid"``): an unknown field is a 400
naming it, and the schema says so (``additionalProperties: false``). Only the
fields in ``NO_OP_FIELDS`` are accepted and ignored (documented in docs/serving.md),
and those in ``unimplemented``'s tables at their neutral values.
Every name is importable from here.
"""

from minivllm.serve.protocol.base import ErrorInfo, ErrorResponse, Float, Int, OpenAIModel, OpenAIResponse, UsageInfo
from minivllm.serve.protocol.requests import (
    ROLES,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ContentPart,
)
from minivllm.serve.protocol.responses import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogProbs,
    ChatMessageOut,
    ChatStreamChoice,
    ChatTokenLogProb,
    CompletionChoice,
    CompletionLogProbs,
    CompletionResponse,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ModelCard,
    ModelList,
    PromptLogprob,
    PromptLogprobs,
    ToolCallOut,
    TopLogProb,
)
from minivllm.serve.protocol.sampling import NO_OP_FIELDS, SERVER_OWNED, SamplingRequest, StreamOptions

__all__ = [
    "NO_OP_FIELDS",
    "ROLES",
    "SERVER_OWNED",
    "ChatChoice",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatLogProbs",
    "ChatMessage",
    "ChatMessageOut",
    "ChatStreamChoice",
    "ChatTokenLogProb",
    "CompletionChoice",
    "CompletionLogProbs",
    "CompletionRequest",
    "CompletionResponse",
    "ContentPart",
    "DeltaFunctionCall",
    "DeltaMessage",
    "DeltaToolCall",
    "ErrorInfo",
    "ErrorResponse",
    "Float",
    "FunctionCall",
    "Int",
    "ModelCard",
    "ModelList",
    "OpenAIModel",
    "OpenAIResponse",
    "PromptLogprob",
    "PromptLogprobs",
    "SamplingRequest",
    "StreamOptions",
    "ToolCallOut",
    "TopLogProb",
    "UsageInfo",
]
