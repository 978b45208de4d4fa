"""How much one HTTP request may queue, and how much the server queues in all.

Checked before a request is tokenized, so a refused request costs nothing:

- ``n`` above ``serve.max_n``: 400 (the engine's ``Processor`` applies the same
  cap, so ``LLM`` refuses it too);
- prompts x ``n`` above ``serve.max_seqs_per_request``: 400;
- more unfinished sequences than ``scheduler.max_num_seqs + serve.max_waiting``
  once this request is added: 503 with ``Retry-After``; nothing is queued.

What is admitted is then scheduled fairly across client requests by the
scheduler's waiting queue (``core/request_queue.py``).
"""

from __future__ import annotations

from minivllm.serve.errors import Overloaded
from minivllm.serve.params import BadRequest
from minivllm.serve.state import ServerState

RETRY_AFTER_S = 1
"""Seconds a client is told to wait after a 503."""


def check_request_size(state: ServerState, n: int, num_prompts: int) -> None:
    """The 400s: ``n`` and prompts x ``n`` against the server's caps."""
    serve = state.cfg.serve
    if n > serve.max_n:
        raise BadRequest("n", f"n={n}: must be in [1, {serve.max_n}] (serve.max_n={serve.max_n})")
    seqs = n * num_prompts
    if seqs > serve.max_seqs_per_request:
        raise BadRequest(
            "n",
            f"n={n}: {num_prompts} prompt(s) x n = {seqs} sequences, more than one request may queue "
            f"(serve.max_seqs_per_request={serve.max_seqs_per_request})",
        )


def check_capacity(state: ServerState, num_seqs: int) -> None:
    """The 503: would ``num_seqs`` more sequences wait beyond ``serve.max_waiting``?"""
    unfinished = state.engine.get_num_unfinished_sequences()
    capacity = state.cfg.scheduler.max_num_seqs + state.cfg.serve.max_waiting
    if unfinished + num_seqs > capacity:
        raise Overloaded(
            f"the server is at capacity ({unfinished} sequences unfinished; it queues at most "
            f"scheduler.max_num_seqs + serve.max_waiting = {capacity}); retry after {RETRY_AFTER_S} s",
            retry_after=RETRY_AFTER_S,
        )


def admit(state: ServerState, n: int, num_prompts: int) -> None:
    check_request_size(state, n, num_prompts)
    check_capacity(state, n * num_prompts)
