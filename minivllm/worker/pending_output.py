"""A step's sampled tokens on their way from the device to the host.

``result()`` is the step's one synchronization: it waits for the copy of the
sampled ids (and logprobs, when asked) and turns them into a
``ModelRunnerOutput``. It also hands the tokens to the persistent batch, so the
runner knows every token it sampled without the scheduler sending them back.
With async scheduling the engine calls it only after launching the next step;
a synchronous step calls it at once. It is idempotent.
"""
from __future__ import annotations

from functools import cached_property
from typing import Callable

import numpy as np
import torch

from minivllm.outputs import ModelRunnerOutput, PositionLogprobs
from minivllm.request import RequestId
from minivllm.sample.sampler import SamplerOutput
from minivllm.worker.input_batch import InputBatch


class PendingOutput:
    def __init__(
        self,
        req_ids: list[RequestId],
        sampled: SamplerOutput,
        num_logprobs: list[int | None],
        prompt_logprobs: dict[RequestId, list[PositionLogprobs | None]],
        deliver: Callable[[list[RequestId], np.ndarray, np.ndarray, int], None],
        rows: np.ndarray,
        version: int,
    ) -> None:
        """``req_ids``: the sampling requests, row by row of ``sampled``; ``num_logprobs``:
        each one's ``logprobs``; ``deliver(req_ids, tokens, rows, version)`` stores the tokens in the batch;
        ``rows``: (S,) the requests' batch rows, ascending, while the batch is at ``version``."""
        self.req_ids = req_ids
        self.rows = rows
        self.version = version
        self.sampled_device = sampled.token_ids  # (S,) int64, read by the next step's placeholders
        self._num_logprobs = num_logprobs
        self._prompt_logprobs = prompt_logprobs
        self._deliver = deliver
        self._host = [
            _to_host(t)
            for t in (sampled.token_ids, sampled.logprobs, sampled.logprob_token_ids, sampled.logprob_ranks)
        ]
        self._event = None
        if sampled.token_ids.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()
        self._output: ModelRunnerOutput | None = None

    @cached_property
    def index_of(self) -> dict[RequestId, int]:
        """Request id -> its row in the sampled tokens."""
        return {r: i for i, r in enumerate(self.req_ids)}

    def indices_of(self, batch: InputBatch, rows: np.ndarray) -> np.ndarray:
        """(P,) int64: where in the sampled tokens the requests in batch ``rows`` find
        theirs (async scheduling's placeholders); each of them sampled in this step.
        While the batch is at this step's version its rows still hold the same
        requests, so a search in the ascending sampled rows tells (checked: a row
        that did not sample here falls through); otherwise, or then, by id (a
        request that did not sample here is a KeyError)."""
        if batch.version == self.version:
            found = np.searchsorted(self.rows, rows)  # (P,)
            if (found < len(self.rows)).all() and (self.rows[found.clip(max=len(self.rows) - 1)] == rows).all():
                return found
        index_of = self.index_of
        return np.fromiter((index_of[batch.req_ids[r]] for r in rows.tolist()), dtype=np.int64, count=len(rows))

    @property
    def resolved(self) -> bool:
        return self._output is not None

    def result(self) -> ModelRunnerOutput:
        if self._output is None:
            if self._event is not None:
                self._event.synchronize()
            self._output = self._collect()
        return self._output

    def _collect(self) -> ModelRunnerOutput:
        token_host, values_host, ids_host, ranks_host = self._host
        tokens = token_host.numpy()
        self._deliver(self.req_ids, tokens, self.rows, self.version)
        out = ModelRunnerOutput(
            sampled_token_ids={r: [t] for r, t in zip(self.req_ids, tokens.tolist())},
            prompt_logprobs=self._prompt_logprobs,
        )
        if values_host is not None:
            values, ids, ranks = values_host.tolist(), ids_host.tolist(), ranks_host.tolist()
            for row, (req_id, asked) in enumerate(zip(self.req_ids, self._num_logprobs)):
                if asked is not None:
                    pairs = dict(zip(ids[row][: 1 + asked], values[row][: 1 + asked]))
                    out.logprobs[req_id] = [PositionLogprobs(pairs, ranks[row])]
        return out


def _to_host(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    if t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
