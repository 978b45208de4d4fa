"""The runner's M-RoPE positions: (3, T) per step for a model that ``supports_mrope``.

A request's prompt positions are computed once, when it joins the batch
(``model.get_mrope_input_positions``), and kept here by request id with its
delta; a step reads the slice its tokens need, so a chunked prefill that
splits an image's placeholders gets the same positions as one that does not.
Every other token (generated, or a prompt without images) sits at its 1-D
position p plus the request's delta (0 without images) in all three rows::

    step tokens  [ r0 prompt 4..7 | r1 decode p=30 ]
    positions    [ prompt[:, 4:8] | 30 + delta(r1) ]   (3, T)

Only a model that takes M-RoPE builds one of these: text-only models pay nothing.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from minivllm.core.scheduler_output import NewRequestData
from minivllm.request import RequestId
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.step_inputs import StepInputs


class MRopePositions:
    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.prompt: dict[RequestId, np.ndarray] = {}
        """(3, prompt length) int64 positions of each request with images."""
        self.delta: dict[RequestId, int] = {}
        self._version = -1
        self._row_delta = np.zeros(0, dtype=np.int64)
        """(num_rows,) each batch row's delta, rebuilt when the batch's membership changes."""
        self._row_prompt_len = np.zeros(0, dtype=np.int64)
        """(num_rows,) prompt length of rows with images; 0 for the others (their 1-D positions will do)."""

    def add(self, new: NewRequestData) -> None:
        """A request joins the batch (again, after a preemption: same prompt, same positions)."""
        if not new.mm_features:
            return
        prompt = new.token_ids[: new.num_prompt_tokens]
        positions, delta = self.model.get_mrope_input_positions(prompt, new.mm_features)
        self.prompt[new.req_id] = positions.numpy()
        self.delta[new.req_id] = int(delta)

    def remove(self, req_id: RequestId) -> None:
        self.prompt.pop(req_id, None)
        self.delta.pop(req_id, None)

    def positions(self, batch: InputBatch, step: StepInputs) -> torch.Tensor:
        """(3, T) int64 on the device for the step's tokens."""
        self._refresh(batch)
        flat, rows = step.token_positions, step.token_rows  # (T,) each
        out = np.empty((3, len(flat)), dtype=np.int64)
        out[:] = flat + self._row_delta[rows]
        in_prompt = np.flatnonzero(flat < self._row_prompt_len[rows])  # prompt tokens of requests with images
        for row in np.unique(rows[in_prompt]).tolist():
            tokens = in_prompt[rows[in_prompt] == row]
            out[:, tokens] = self.prompt[batch.req_ids[row]][:, flat[tokens]]
        return torch.from_numpy(out).to(self.device)

    def _refresh(self, batch: InputBatch) -> None:
        if batch.version == self._version:
            return
        ids = batch.req_ids[: batch.num_rows]
        self._row_delta = np.fromiter((self.delta.get(r, 0) for r in ids), dtype=np.int64, count=len(ids))
        self._row_prompt_len = np.fromiter(
            (self.prompt[r].shape[1] if r in self.prompt else 0 for r in ids), dtype=np.int64, count=len(ids)
        )
        self._version = batch.version
