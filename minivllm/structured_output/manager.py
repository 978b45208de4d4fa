"""Structured outputs on the scheduler's side: compiled grammars and one matcher
per request, keyed by request id.

    add_request   -> compile in a thread pool (cached per constraint)
    is_ready      -> the scheduler admits a request once its grammar is compiled
    fill_bitmask  -> one allowed-token bitmask row per request that samples this step
    accept_tokens -> the matcher follows every accepted output token

A matcher only ever consumes output tokens it has not seen (``num_accepted``
counts them), so recomputing a preempted request, or admitting it on a cached
prefix, never feeds the matcher the same tokens twice. Everything here is built
on the first structured request: an engine that never gets one pays nothing.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from minivllm.request import Request, RequestId
from minivllm.structured_output.backend import XGrammarBackend
from minivllm.structured_output_params import GrammarKey, StructuredOutputsParams

logger = logging.getLogger(__name__)
_COMPILE_THREADS = 1
"""One compile thread: it leaves the step loop its core and keeps compiles in order."""
CACHE_SIZE = 256
"""Compiled grammars kept for reuse (least recently used go first); matchers hold
their own reference, so eviction never affects a running request."""


@dataclass(slots=True)
class _RequestGrammar:
    compiled: Future
    matcher: Any = None
    num_accepted: int = 0
    """Output tokens the matcher has consumed."""
    failed: bool = False
    """The grammar did not compile: the request runs one step unconstrained, then is aborted."""


class StructuredOutputManager:
    def __init__(self, make_backend: Callable[[], XGrammarBackend]) -> None:
        self._make_backend = make_backend
        self._backend: XGrammarBackend | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._cache: OrderedDict[GrammarKey, Future] = OrderedDict()
        """Compiled grammars (or compiles under way) per constraint, least recently used first."""
        self._requests: dict[RequestId, _RequestGrammar] = {}

    @property
    def active(self) -> bool:
        """Whether any request has a grammar (the scheduler's one check per step)."""
        return bool(self._requests)

    def add_request(self, request: Request) -> None:
        params = request.sampling_params.structured_outputs
        if params is None:
            return
        if self._backend is None:
            self._backend = self._make_backend()
            self._pool = ThreadPoolExecutor(_COMPILE_THREADS, thread_name_prefix="grammar-compile")
        self._requests[request.request_id] = _RequestGrammar(self._compiled(params))

    def _compiled(self, params: StructuredOutputsParams) -> Future:
        """The cached compile of ``params``'s constraint, started if new."""
        key = params.key()
        future = self._cache.get(key)
        if future is None:
            future = self._pool.submit(self._backend.compile, params)
            self._cache[key] = future
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        return future

    def is_ready(self, request: Request) -> bool:
        """True when the request has no grammar or its grammar is compiled (its matcher
        made), or failed to compile (it is aborted at its first token, so that the
        front end hears of it through the usual outputs)."""
        state = self._requests.get(request.request_id)
        if state is None or state.matcher is not None or state.failed:
            return True
        if not state.compiled.done():
            return False
        if state.compiled.exception() is not None:
            logger.error(
                "request %s: its grammar failed to compile (%s); aborting it",
                request.request_id,
                state.compiled.exception(),
            )
            state.failed = True
            return True
        state.matcher = self._backend.matcher(state.compiled.result())
        return True

    def failed(self, request: Request) -> bool:
        state = self._requests.get(request.request_id)
        return state is not None and state.failed

    def accept_tokens(self, request: Request) -> bool:
        """Feed the matcher the request's output tokens it has not seen yet. True when
        the request must stop: its grammar reached its end, or a token was refused."""
        state = self._requests.get(request.request_id)
        if state is None:
            return False
        if state.failed:
            return True
        outputs = request.output_token_ids
        while state.num_accepted < len(outputs):
            token = outputs[state.num_accepted]
            state.num_accepted += 1
            if not state.matcher.accept_token(token):
                logger.error("request %s: token %d does not fit its grammar; stopping it", request.request_id, token)
                return True
        return state.matcher.is_terminated()

    def fill_bitmask(self, requests: list[Request]) -> tuple[np.ndarray, list[RequestId]] | None:
        """(rows, ceil(vocab / 32)) int32 allowed-token bits for those of ``requests``
        that have a grammar, and their ids in row order; None when none has one."""
        rows = [r for r in requests if (s := self._requests.get(r.request_id)) is not None and not s.failed]
        if not rows:
            return None
        bitmask = self._backend.allocate_bitmask(len(rows))
        for i, request in enumerate(rows):
            self._requests[request.request_id].matcher.fill_next_token_bitmask(bitmask, i)
        return bitmask.numpy(), [r.request_id for r in rows]

    def remove(self, request_id: RequestId) -> None:
        self._requests.pop(request_id, None)
