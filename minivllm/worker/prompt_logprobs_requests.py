"""The requests of a worker's batch that gather prompt logprobs, and each step's share of them.

A request asks with ``SamplingParams.prompt_logprobs``; its logprobs are gathered
during its first prefill only, chunk by chunk (``sample/prompt_logprobs.py``),
and handed out with its first sample. After a preemption they were already sent
with the first output, so a readmitted request (more tokens than its prompt) is
not tracked again.
"""

from __future__ import annotations

from typing import Callable

import torch

from minivllm.core.scheduler_output import NewRequestData
from minivllm.outputs import PositionLogprobs
from minivllm.request import RequestId
from minivllm.sample.prompt_logprobs import PromptLogprobsState, add_prompt_logprobs
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.step_inputs import StepInputs


class PromptLogprobsRequests:
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
