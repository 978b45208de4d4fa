"""The engine process behind ``AsyncLLM``: an ``LLMEngine`` stepping in a loop.

The front end (HTTP handlers, the asyncio loop) and the step loop live in
different processes, so neither waits on the other's GIL. They talk over two
one-way pipes of pickled messages:

    front end                                           engine process
    ---------                                           --------------
    ("add", ProcessedRequest)                       ──► LLMEngine.add_processed (checked and tokenized
                                                        by the front end's Processor; not again here)
    ("abort", [ids])                                ──► LLMEngine.abort_request (blocks freed now)
    ("stats", token)                                ──► scheduler_stats()
    ("rpc", token, call)                            ──► collective_rpc (call: cloudpickled method, args, kwargs)
    ("call", token, name, args)                     ──► LLMEngine.<name>(*args), name in ENGINE_CALLS
    ("shutdown", None)                              ──► leave the loop
                                                    ◄── EngineMessage(added, add_errors, replies)
                                                    ◄── EngineMessage(outputs=[RequestOutput (DELTA)])

Commands are drained between steps, never during one, so an abort frees its
blocks before the next step is scheduled. Outputs are deltas; the front end
keeps the prompt and accumulates text, so each message carries only what is new,
packed as plain tuples (pickling dataclasses costs ten times more, per request
per step).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import signal
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from operator import attrgetter
from typing import Any

from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.outputs import CompletionOutput, RequestOutput
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.pooling.outputs import PoolingRequestOutput

_COMPLETION_FIELDS = tuple(f.name for f in dataclasses.fields(CompletionOutput))
_FRONT_END_FIELDS = ("prompt", "prompt_token_ids", "outputs", "metrics")
_REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(RequestOutput) if f.name not in _FRONT_END_FIELDS)
PackedOutput = tuple[tuple, list[tuple]]
_request_head, _completion = attrgetter(*_REQUEST_FIELDS), attrgetter(*_COMPLETION_FIELDS)
ENGINE_CALLS = ("sleep", "wake_up", "is_sleeping")
"""The LLMEngine methods a front end may call by name (sleep mode, for the server's dev routes)."""


def pack_output(out: RequestOutput) -> PackedOutput:
    """What the engine knows of one output, as tuples (the front end adds prompt and timings)."""
    return _request_head(out), [_completion(c) for c in out.outputs]


def unpack_output(packed: PackedOutput) -> RequestOutput:
    head, completions = packed
    outputs = [CompletionOutput(*c) for c in completions]  # fields in declaration order
    return RequestOutput(prompt=None, prompt_token_ids=[], outputs=outputs, **dict(zip(_REQUEST_FIELDS, head)))


@dataclass
class EngineInfo:
    """What the front end learns once the engine is up."""

    kv_spec: KVCacheSpec
    """The KV cache the workers allocated for the model they loaded (block count, sliding
    window): the front end checks requests against it without building the model itself."""


@dataclass
class EngineMessage:
    """Everything the engine process has to say after one drain or one step."""

    outputs: list[PackedOutput] = field(default_factory=list)
    """``pack_output`` of each output of one step."""
    pooled: list[PoolingRequestOutput] = field(default_factory=list)
    """runner=pooling: the requests whose pooled vector is ready."""
    added: list[str] = field(default_factory=list)
    """Requests accepted by ``LLMEngine.add_processed``."""
    add_errors: dict[str, str] = field(default_factory=dict)
    """Requests refused, with the ValueError's message."""
    replies: dict[int, Any] = field(default_factory=dict)
    """Answers to ``stats`` calls, by call token."""
    ready: EngineInfo | None = None
    fatal: str | None = None
    """Set when the engine failed (at start-up or in a step); the process then exits."""
    fatal_is_config_error: bool = False
    """The failure was a ValueError (a bad config), not a crash."""

    def __bool__(self) -> bool:
        return bool(
            self.outputs or self.pooled or self.added or self.add_errors or self.replies or self.ready or self.fatal
        )


def run_engine_proc(cfg: VllmConfig, commands: Connection, results: Connection, log_level: int) -> None:
    """Entry point of the engine process (started with the ``spawn`` method)."""
    # The parent owns shutdown: Ctrl-C or SIGTERM sent to the process group must
    # not kill the engine under in-flight requests. A dead parent closes the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s [engine] %(levelname)s %(name)s: %(message)s")
    from minivllm.engine.llm_engine import LLMEngine

    try:
        engine = LLMEngine(cfg)
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises it
        results.send(EngineMessage(fatal=_describe(err), fatal_is_config_error=isinstance(err, ValueError)))
        return
    info = EngineInfo(kv_spec=engine.core.kv_spec)
    results.send(EngineMessage(ready=info))
    try:
        _loop(engine, commands, results)
    except (EOFError, OSError, BrokenPipeError):
        pass  # the front end is gone
    except BaseException as err:  # noqa: BLE001
        try:
            results.send(EngineMessage(fatal=_describe(err)))
        except OSError:
            pass
    finally:
        engine.shutdown()


def _loop(engine: Any, commands: Connection, results: Connection) -> None:
    while True:
        # Block while idle; between steps, only look.
        idle = not engine.has_unfinished_requests()
        msg = EngineMessage()
        if commands.poll(None if idle else 0):
            if not _drain(engine, commands, msg):
                return
        if msg:
            results.send(msg)
        if engine.has_unfinished_requests():
            msg = step_once(engine)
            if msg:
                results.send(msg)


def step_once(engine: Any) -> EngineMessage:
    """One engine step, its outputs packed for the front end (pooled vectors travel as they are)."""
    msg = EngineMessage()
    for out in engine.step():
        if isinstance(out, RequestOutput):
            msg.outputs.append(pack_output(out))
        else:
            msg.pooled.append(out)
    return msg


def _drain(engine: Any, commands: Connection, msg: EngineMessage) -> bool:
    """Apply every queued command; False when asked to shut down."""
    while commands.poll(0):
        kind, *args = commands.recv()
        if kind == "add":
            request = args[0]
            try:
                engine.add_processed(request)
                msg.added.append(request.request_id)
            except ValueError as err:
                msg.add_errors[request.request_id] = str(err)
        elif kind == "abort":
            engine.abort_request(args[0])
        elif kind == "stats":
            msg.replies[args[0]] = engine.scheduler_stats()
        elif kind == "rpc":
            token, call = args
            msg.replies[token] = _run_rpc(engine, call)
        elif kind == "call":
            token, name, call_args = args
            msg.replies[token] = _call_engine(engine, name, call_args)
        elif kind == "shutdown":
            return False
        else:
            raise ValueError(f"engine process: unknown command {kind!r}")
    return True


def _run_rpc(engine: Any, call: bytes) -> Any:
    """A user's ``collective_rpc``: its results, or the error it raised (as a value)."""
    try:
        method, args, kwargs = pickle.loads(call)
        return engine.collective_rpc(method, args, kwargs)
    except Exception as err:  # noqa: BLE001 - the caller raises it
        return RuntimeError(str(err))


def _call_engine(engine: Any, name: str, args: tuple) -> Any:
    """``engine.<name>(*args)``; the ValueError it raises comes back as the reply."""
    if name not in ENGINE_CALLS:
        return ValueError(f"engine process: {name!r} is not one of {', '.join(ENGINE_CALLS)}")
    try:
        return getattr(engine, name)(*args)
    except ValueError as err:
        return ValueError(str(err))


def _describe(err: BaseException) -> str:
    if isinstance(err, ValueError):
        return str(err)
    return "".join(traceback.format_exception(type(err), err, err.__traceback__))
