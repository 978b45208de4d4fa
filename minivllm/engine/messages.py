"""What a front end and its engine processes (or Ray replicas) say to each other: one
dataclass per command and per reply.

    front end                                   engine process (an LLMEngine)
    ---------                                   -----------------------------
    AddRequest(request)                     ──► add_processed (checked and tokenized by the
                                                front end's Processor; not again here)
    AbortRequests(request_ids)              ──► abort_request (blocks freed now)
    GetStats(token)                         ──► scheduler_stats()
    CollectiveRpc(token, call)              ──► collective_rpc (call: cloudpickled method, args, kwargs)
    Sleep(token, level), WakeUp(token, tags),
    IsSleeping(token)                       ──► sleep mode (the server's dev routes)
    Shutdown()                              ──► leave the loop
                                            ◄── EngineReady(kv_spec) or EngineFailed, once, at start-up
                                            ◄── EngineOutputs(added, refused, replies), after the commands
                                            ◄── EngineOutputs(outputs, pooled), after a step
                                            ◄── EngineFailed(reason), when the engine stops on an error

A ``Call`` carries a token that ``EngineCoreClient.ask_all`` handed out; its
answer comes back in ``EngineOutputs.replies`` under that token (an error the
engine keeps serving after, as a value). ``EngineOutputs`` is also what
``EngineCoreClient.receive`` hands its owner: the same fields, with the outputs
of requests aborted meanwhile dropped, the prompts filled in and ``failure`` set
when a replica stopped.

Outputs are deltas; the front end keeps the prompt and accumulates text, so each
message carries only what is new, pickled as plain tuples (pickling dataclasses
costs ten times more, per request per step).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from minivllm.engine.processor import ProcessedRequest
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.outputs import CompletionOutput, PoolingRequestOutput, RequestOutput

# ---- commands (front end -> engine) --------------------------------------------------------


@dataclass
class AddRequest:
    request: ProcessedRequest


@dataclass
class AbortRequests:
    request_ids: list[str]


@dataclass
class Call:
    """A command whose answer comes back in ``EngineOutputs.replies[token]``."""

    token: int


@dataclass
class GetStats(Call):
    pass


@dataclass
class CollectiveRpc(Call):
    call: bytes
    """The cloudpickled ``(method, args, kwargs)`` (unpickled in the engine, so a failure is a reply)."""


@dataclass
class Sleep(Call):
    level: int = 1


@dataclass
class WakeUp(Call):
    tags: list[str] | None = None


@dataclass
class IsSleeping(Call):
    pass


@dataclass
class Shutdown:
    pass


Command = AddRequest | AbortRequests | GetStats | CollectiveRpc | Sleep | WakeUp | IsSleeping | Shutdown

# ---- replies (engine -> front end) ---------------------------------------------------------


@dataclass
class EngineReady:
    """The engine is up: the first message of a healthy engine."""

    kv_spec: KVCacheSpec
    """The KV cache the workers allocated for the model they loaded (block count, sliding
    window): the front end checks requests against it without building the model itself."""


@dataclass
class EngineFailed:
    """The engine failed (at start-up, or in a step or a command); it then exits."""

    reason: str
    config_error: bool = False
    """The failure was a ValueError (a bad config), not a crash."""


@dataclass
class EngineOutputs:
    """Everything an engine has to say after one round of commands or one step."""

    outputs: list[RequestOutput] = field(default_factory=list)
    """The step's outputs (deltas; between processes without prompt, prompt ids or metrics)."""
    pooled: list[PoolingRequestOutput] = field(default_factory=list)
    """runner=pooling: the requests whose pooled vector is ready."""
    added: list[str] = field(default_factory=list)
    """Requests accepted by ``LLMEngine.add_processed``."""
    refused: dict[str, str] = field(default_factory=dict)
    """Requests refused, with the ValueError's message."""
    replies: dict[int, Any] = field(default_factory=dict)
    """Answers to ``Call`` commands, by token."""
    failure: str | None = None
    """Set by ``EngineCoreClient.receive`` when the replica reported ``EngineFailed`` (the first
    failure, naming the replica); an engine never sets it."""

    def __bool__(self) -> bool:
        return bool(self.outputs or self.pooled or self.added or self.refused or self.replies or self.failure)

    def __reduce__(self) -> tuple:
        packed = [_pack(out) for out in self.outputs]
        return (_unpacked, (packed, self.pooled, self.added, self.refused, self.replies, self.failure))


_COMPLETION_FIELDS = tuple(f.name for f in dataclasses.fields(CompletionOutput))
_FRONT_END_FIELDS = ("prompt", "prompt_token_ids", "outputs", "metrics")
_REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(RequestOutput) if f.name not in _FRONT_END_FIELDS)
_request_head, _completion = attrgetter(*_REQUEST_FIELDS), attrgetter(*_COMPLETION_FIELDS)
PackedOutput = tuple[tuple, list[tuple]]


def _pack(out: RequestOutput) -> PackedOutput:
    """What the engine knows of one output, as tuples (the front end adds prompt and timings)."""
    return _request_head(out), [_completion(c) for c in out.outputs]


def _unpack(packed: PackedOutput) -> RequestOutput:
    head, completions = packed
    outputs = [CompletionOutput(*c) for c in completions]  # fields in declaration order
    return RequestOutput(prompt=None, prompt_token_ids=[], outputs=outputs, **dict(zip(_REQUEST_FIELDS, head)))


def _unpacked(packed: list[PackedOutput], *rest: Any) -> EngineOutputs:
    return EngineOutputs([_unpack(p) for p in packed], *rest)
