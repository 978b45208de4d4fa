"""Which rows of the persistent batch have new tokens in a step, and how many each."""

from __future__ import annotations

import numpy as np

from minivllm.request import RequestId
from minivllm.worker.input_batch import InputBatch


class ScheduledRows:
    """Answers from shared read-only ``arange``/``ones`` arrays in the common cases (every
    row scheduled; every row decoding one token), so a decode step allocates nothing."""

    def __init__(self, max_reqs: int) -> None:
        self._all_rows = np.arange(max_reqs)
        self._ones = np.ones(max_reqs, dtype=np.int32)
        for shared in (self._all_rows, self._ones):  # slices of them are handed out as a step's rows and counts
            shared.flags.writeable = False

    def __call__(
        self, batch: InputBatch, counts: dict[RequestId, int], num_tokens: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(B,) batch rows with new tokens this step, in row order, and (B,) their counts
        (``counts``: the scheduled tokens per request, ``num_tokens`` in all)."""
        if len(counts) == batch.num_rows == num_tokens:
            # Every request in the batch (scheduled ones all are) decodes one token.
            return self._all_rows[:num_tokens], self._ones[:num_tokens]
        ids = batch.req_ids[: batch.num_rows]
        n = np.fromiter((counts.get(r, 0) for r in ids), dtype=np.int32, count=len(ids))
        if n.all():
            return self._all_rows[: len(ids)], n
        rows = np.flatnonzero(n)
        return rows, n[rows]
