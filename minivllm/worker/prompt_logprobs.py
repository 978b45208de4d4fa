"""Prompt logprobs: for each prompt token after the first, its logprob given the
tokens before it, plus the top-k alternatives.

A request asks with ``SamplingParams.prompt_logprobs``. The hidden state at position
``p`` predicts token ``p + 1``, so a prefill chunk covering positions ``[start, end)``
yields entries for prompt tokens ``start + 1 .. min(end, P - 1)`` (the last prompt
position predicts the first output token, which the sampler handles). Chunked prefill
spreads a prompt over several steps; each step adds its chunk's entries to the
request's state, and the complete list goes out with the request's first sample.
After a preemption they were already sent with the first output, so a readmitted
request (more tokens than its prompt) is not tracked again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from minivllm.core.scheduler_output import NewRequestData
from minivllm.outputs import PositionLogprobs
from minivllm.request import RequestId
from minivllm.sample.sampler import gather_logprobs
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.step_inputs import StepInputs

_ROWS_PER_PASS = 256
"""Positions whose (rows, vocab) logits are materialised at once."""


class PromptLogprobsRequests:
    """The requests of a worker's batch that gather prompt logprobs (a request store of the
    batch: ``InputBatch.register``), and each step's share of them."""

    def __init__(self) -> None:
        self.states: dict[RequestId, PromptLogprobsState] = {}

    def __len__(self) -> int:
        return len(self.states)

    def add(self, new: NewRequestData) -> None:
        k = new.sampling_params.prompt_logprobs
        if k is not None and len(new.token_ids) == new.num_prompt_tokens:
            self.states[new.req_id] = PromptLogprobsState(list(new.token_ids), k)

    def remove(self, req_id: RequestId) -> None:
        self.states.pop(req_id, None)

    def gather(
        self,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
        hidden: torch.Tensor,
        step: StepInputs,
        batch: InputBatch,
    ) -> dict[RequestId, list[PositionLogprobs | None]]:
        """Add this step's chunk to each asking request's prompt logprobs (hidden: (T, H));
        returns the complete lists of the requests that sample now (and forgets them)."""
        chunks, done = [], {}
        sampling = set(step.sample_idx.tolist())
        for i, row in enumerate(step.rows.tolist()):
            req_id = batch.req_ids[row]
            state = self.states.get(req_id)
            if state is None:
                continue
            computed = int(batch.num_computed_tokens[row])
            chunks.append((state, int(step.query_start[i]), computed, int(step.query_lens[i])))
            if i in sampling:
                done[req_id] = state
        add_prompt_logprobs(compute_logits, hidden, chunks)
        for req_id in done:
            del self.states[req_id]
        return {req_id: state.entries for req_id, state in done.items()}


@dataclass(slots=True)
class PromptLogprobsState:
    """Prompt logprobs a worker gathers for a request, chunk by chunk, until its first sample."""

    prompt_token_ids: list[int]
    num_logprobs: int
    """The request's ``prompt_logprobs`` (top-k alternatives per prompt token)."""
    entries: list[PositionLogprobs | None] = field(default_factory=lambda: [None])
    """Entry ``j`` is prompt token ``j``'s (its own logprob and rank, then the top-k); entry 0 is None."""

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def add(self, first_token: int, entries: list[PositionLogprobs]) -> None:
        """Entries for prompt tokens ``first_token ..``; tokens skipped before it
        (KV reused from a cache, so never computed here) get None."""
        self.entries.extend([None] * (first_token - len(self.entries)))
        self.entries.extend(entries)


def add_prompt_logprobs(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    chunks: list[tuple[PromptLogprobsState, int, int, int]],
) -> None:
    """hidden: (T, H) of this step's flat batch; ``chunks``: per request that asked,
    (its state, its first row in the flat batch, tokens computed before this step, new tokens)."""
    rows: list[int] = []
    targets: list[int] = []
    spans: list[tuple[PromptLogprobsState, int, int]] = []  # (state, first prompt token, count)
    for state, first_row, computed, query_len in chunks:
        start, end = computed, min(computed + query_len, state.num_prompt_tokens - 1)
        if end <= start:
            continue
        rows.extend(range(first_row, first_row + end - start))
        targets.extend(state.prompt_token_ids[start + 1 : end + 1])
        spans.append((state, start + 1, end - start))
    if not rows:
        return
    k = max(state.num_logprobs for state, _, _ in spans)
    entries = _entries(compute_logits, hidden, rows, targets, k)
    offset = 0
    for state, first, count in spans:
        asked = 1 + state.num_logprobs
        chunk = entries[offset : offset + count]
        state.add(first, [PositionLogprobs(dict(pairs[:asked]), rank) for pairs, rank in chunk])
        offset += count


def _entries(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    rows: list[int],
    targets: list[int],
    k: int,
) -> list[tuple[list[tuple[int, float]], int]]:
    """Per row: the (token id, logprob) pairs of the target then of the top ``k``,
    and the target's rank."""
    device = hidden.device
    out = []
    for lo in range(0, len(rows), _ROWS_PER_PASS):
        idx = torch.tensor(rows[lo : lo + _ROWS_PER_PASS], dtype=torch.long, device=device)
        tgt = torch.tensor(targets[lo : lo + _ROWS_PER_PASS], dtype=torch.long, device=device)
        values, ids, ranks = gather_logprobs(compute_logits(hidden[idx]), tgt, k)  # (M, 1 + k) x2, (M,)
        out.extend((list(zip(i, v)), r) for i, v, r in zip(ids.tolist(), values.tolist(), ranks.tolist()))
    return out
