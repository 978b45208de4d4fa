"""POST /v1/chat/completions: messages -> the chat template -> one request, ``n`` choices.

A choice's text is then split into ``reasoning_content``, ``content`` and
``tool_calls``, whole or streamed as deltas (``ChatOutputParser``). The reasoning
parser (``serve.reasoning_parser``) splits first; the tool plan then reads the
content. Streamed content that may still turn into a tool call is held back until
it is clear; calls are sent whole, one delta each, when the choice ends. A named
function's call too: its arguments are held until they parse, so a choice cut
short by ``max_tokens`` never streams a call whose arguments do not parse (its
text goes out as content, with ``finish_reason`` "length").
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator

from fastapi import Request

from minivllm.engine.request_stream import RequestStream
from minivllm.outputs import CompletionOutput
from minivllm.sampling_params import RequestOutputKind
from minivllm.serve.admission import (
    EngineRequests,
    Prompt,
    admit,
    check_text_length,
    fetch_media,
    message_texts,
    off_loop,
    render_messages,
)
from minivllm.serve.completions import prompt_logprobs_json
from minivllm.serve.errors import BadRequest
from minivllm.serve.outputs import StreamUsage, event_stream, finished, merged, sse, usage
from minivllm.serve.params import structured_outputs_of, to_sampling_params
from minivllm.serve.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogProbs,
    ChatMessageOut,
    ChatStreamChoice,
    ChatTokenLogProb,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCallOut,
    TopLogProb,
    UsageInfo,
)
from minivllm.serve.reasoning import REASONING_PARSERS, ThinkParser
from minivllm.serve.state import ServerState
from minivllm.serve.tools import ToolCall, ToolPlan, plan_tools
from minivllm.structured_output import StructuredOutputsParams


async def create_chat_completion(state: ServerState, body: ChatCompletionRequest, raw: Request) -> Any:
    lora = state.check_model(body.model)
    admit(state, body.n, 1)
    if body.stream_options is not None and not body.stream:
        raise BadRequest("stream_options", "stream_options: only allowed with stream=true")
    if body.top_logprobs is not None and not body.logprobs:
        raise BadRequest("top_logprobs", "top_logprobs: needs logprobs=true")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    kind = RequestOutputKind.DELTA if body.stream else RequestOutputKind.FINAL_ONLY
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    tools = plan_tools(body, state.cfg.serve.tool_call_parser)
    constraint = _constraint(body, tools)
    params = to_sampling_params(
        body,
        state.default_sampling_params,
        max_tokens=max_tokens,
        logprobs=logprobs,
        output_kind=kind,
        structured_outputs=constraint,
    )
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    check_text_length(state, "messages", message_texts(body.messages), body.truncate_prompt_tokens)
    messages = [m.template_fields() for m in body.messages]
    media = await fetch_media(state, messages)  # on the loop: http(s) image URLs, each under its deadline
    rendered = await off_loop(render_messages, state, body, messages, tools.tools if tools is not None else None, media)
    requests = EngineRequests(
        state.engine, request_id, params, body.priority, lora, max_tokens=max_tokens, prompt_field="messages"
    )
    prompt = await off_loop(requests.add, rendered)
    streams = await requests.start()
    fmt = _Formatter(state, body, prompt, ChatOutputParser(tools, _reasoning_parser(state, constraint)))
    if body.stream:
        return event_stream(_stream(body, request_id, streams, fmt))
    outs = await finished(raw, streams)
    choices = [fmt.choice(c) for c in outs[0].outputs]
    model = state.shown_model(body.model)
    shown = prompt_logprobs_json(outs[0].prompt_logprobs) if body.prompt_logprobs is not None else None
    return ChatCompletionResponse(
        id=request_id,
        model=model,
        choices=choices,
        usage=usage([prompt], outs),
        prompt_logprobs=shown,
        kv_transfer_params=outs[0].kv_transfer_params,
    )


def _constraint(body: ChatCompletionRequest, tools: ToolPlan | None) -> StructuredOutputsParams | None:
    """response_format / guided_* / structured_outputs, or what tool_choice enforces (not both)."""
    asked = structured_outputs_of(body)
    enforced = tools.constraint if tools is not None else None
    if asked is not None and enforced is not None:
        raise BadRequest(
            "tool_choice",
            f"tool_choice={body.tool_choice!r}: cannot be combined with response_format or another output constraint",
        )
    return enforced or asked


def _reasoning_parser(state: ServerState, constraint: StructuredOutputsParams | None) -> ThinkParser | None:
    """serve.reasoning_parser; under an output constraint, reasoning is only what the output itself
    opens with ``<think>``: the constraint holds from the first token, so the output never begins
    inside reasoning the prompt opened (DeepSeek-R1), and JSON or tool calls stay the content."""
    name = state.cfg.serve.reasoning_parser
    if not name:
        return None
    parser = REASONING_PARSERS[name]
    return parser if constraint is None else replace(parser, starts_in_prompt=False)


class _Formatter:
    def __init__(
        self, state: ServerState, body: ChatCompletionRequest, prompt: Prompt, parser: ChatOutputParser
    ) -> None:
        self.state, self.body, self.prompt, self.parser = state, body, prompt, parser

    def choice(self, c: CompletionOutput) -> ChatChoice:
        parsed = self.parser.whole(c.text)
        message = ChatMessageOut(
            content=parsed.content, reasoning_content=parsed.reasoning_content, tool_calls=parsed.tool_calls
        )
        return ChatChoice(
            index=c.index,
            message=message,
            logprobs=self.logprobs(c),
            finish_reason=self.parser.finish_reason(c.finish_reason, bool(parsed.tool_calls)),
            stop_reason=c.stop_reason,
        )

    def logprobs(self, c: CompletionOutput) -> ChatLogProbs | None:
        if not self.body.logprobs:
            return None
        content = []
        for token_id, top in zip(c.token_ids, c.logprobs or []):
            ranked = sorted(top.items(), key=lambda kv: -kv[1])[: self.body.top_logprobs or 0]
            content.append(
                ChatTokenLogProb(
                    **self._entry(token_id, top[token_id]).model_dump(),
                    top_logprobs=[self._entry(t, lp) for t, lp in ranked],
                )
            )
        return ChatLogProbs(content=content)

    def _entry(self, token_id: int, logprob: float) -> TopLogProb:
        token = self.state.token_text(token_id)
        return TopLogProb(token=token, logprob=logprob, bytes=list(token.encode("utf-8")))


async def _stream(
    body: ChatCompletionRequest, request_id: str, streams: list[RequestStream], fmt: _Formatter
) -> AsyncIterator[str]:
    model = fmt.state.shown_model(body.model)
    counted = StreamUsage(body, [fmt.prompt])
    created = int(time.time())  # one for the whole stream, as OpenAI's chunks share theirs

    def chunk(choices: list[ChatStreamChoice], so_far: UsageInfo | None = None) -> str:
        so_far = counted.on_chunk() if so_far is None else so_far
        return sse(ChatCompletionChunk(id=request_id, created=created, model=model, choices=choices, usage=so_far))

    parsers = [fmt.parser.stream() for _ in range(body.n)]
    yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant", content="")) for i in range(body.n)])
    async for _, out in merged(streams):
        counted.count(out.outputs)
        choices = []
        for c in out.outputs:
            parser = parsers[c.index]
            delta = parser.feed(c.text, final=c.finish_reason is not None)
            # Text held back (a tool call not yet parsed, a possible stop string) sends nothing,
            # as in vLLM, unless the tokens' logprobs must go out now.
            if delta is not None or c.finish_reason is not None or (c.token_ids and body.logprobs):
                reason = fmt.parser.finish_reason(c.finish_reason, parser.has_calls)
                choices.append(
                    ChatStreamChoice(
                        index=c.index,
                        delta=delta or DeltaMessage(),
                        logprobs=fmt.logprobs(c),
                        finish_reason=reason,
                        stop_reason=c.stop_reason,
                    )
                )
        if choices:
            yield chunk(choices)
    if counted.at_end:
        yield chunk([], counted.so_far())


@dataclass
class ParsedChoice:
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] = field(default_factory=list)


def tool_calls_out(calls: list[ToolCall]) -> list[ToolCallOut]:
    return [ToolCallOut(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls]


class ChatOutputParser:
    """A choice's text -> ``reasoning_content``, ``content`` and ``tool_calls``, whole or streamed
    (``stream()``: one ``ChoiceStream`` per choice)."""

    def __init__(self, tools: ToolPlan | None, reasoning: ThinkParser | None) -> None:
        self.tools, self.reasoning = tools, reasoning

    def finish_reason(self, reason: str | None, parsed_calls: bool) -> str | None:
        """OpenAI's "tool_calls" when the model chose to call (auto, required)."""
        if parsed_calls and reason == "stop" and self.tools is not None and self.tools.mode in ("auto", "required"):
            return "tool_calls"
        return reason

    def whole(self, text: str) -> ParsedChoice:
        reasoning, content = self.reasoning.split(text) if self.reasoning else (None, text)
        if self.tools is None or content is None:
            return ParsedChoice(content, reasoning)
        content, calls = self.tools.parse(content)
        return ParsedChoice(content, reasoning, tool_calls_out(calls))

    def stream(self) -> ChoiceStream:
        return ChoiceStream(self)


class ChoiceStream:
    """One choice's deltas: feed each new piece of text, the last with ``final``."""

    def __init__(self, parser: ChatOutputParser) -> None:
        self.parser = parser
        self.think = parser.reasoning.stream() if parser.reasoning else None
        self.content = ""
        """All content so far (after reasoning)."""
        self.sent = 0
        """Characters of ``content`` already sent."""
        self.has_calls = False

    def feed(self, delta: str, final: bool) -> DeltaMessage | None:
        reasoning, content = self.think.feed(delta, final) if self.think else ("", delta)
        self.content += content
        out = DeltaMessage(reasoning_content=reasoning or None)
        tools = self.parser.tools
        if tools is None or tools.mode == "none":
            out.content = self._send(len(self.content))
        elif not final:
            safe = tools.parser.safe_prefix(self.content) if tools.mode == "auto" else 0
            out.content = self._send(safe)
        else:
            self._finish_tools(tools, out)
        return out if out.content or out.reasoning_content or out.tool_calls else None

    def _finish_tools(self, tools: ToolPlan, out: DeltaMessage) -> None:
        rest, calls = tools.parse(self.content)
        sent = self.content[: self.sent]
        if rest is not None and rest.startswith(sent):
            out.content = rest[len(sent) :] or None
        self.has_calls = bool(calls)
        out.tool_calls = [
            DeltaToolCall(index=i, id=c.id, function=DeltaFunctionCall(name=c.name, arguments=c.arguments))
            for i, c in enumerate(calls)
        ] or None

    def _send(self, upto: int) -> str | None:
        if upto <= self.sent:
            return None
        piece, self.sent = self.content[self.sent : upto], upto
        return piece
