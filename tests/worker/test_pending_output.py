"""A step's pending sampled tokens: where the next step's placeholders find each
request's token, by batch row while the batch is unchanged and by id once rows moved."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.sample.sampler import SamplerOutput
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.pending_output import PendingOutput
from tests.worker.test_input_batch import CPU, new


def _batch(*req_ids: str) -> InputBatch:
    batch = InputBatch(max_num_reqs=6, max_model_len=8, max_blocks_per_req=2)
    for i, req_id in enumerate(req_ids):
        batch.add(new(req_id, [10 + i], [i]), CPU)
    return batch


def _pending(batch: InputBatch, rows: list[int]) -> PendingOutput:
    tokens = torch.tensor([100 + r for r in rows])
    return PendingOutput(
        req_ids=[batch.req_ids[r] for r in rows],
        sampled=SamplerOutput(tokens, None, None, None),
        num_logprobs=[None] * len(rows),
        prompt_logprobs={},
        deliver=lambda *args: None,
        rows=np.asarray(rows),
        version=batch.version,
    )


def _by_id(pending: PendingOutput, batch: InputBatch, rows: list[int]) -> list[int]:
    return [pending.index_of[batch.req_ids[r]] for r in rows]


def test_rows_of_an_unchanged_batch_find_their_tokens_as_the_ids_do():
    batch = _batch("a", "b", "c", "d", "e")
    pending = _pending(batch, [0, 2, 3])  # b and e sampled nothing (mid-prefill)
    rows = [3, 0, 2]
    assert pending.indices_of(batch, np.asarray(rows)).tolist() == _by_id(pending, batch, rows) == [2, 0, 1]


def test_rows_that_moved_after_the_step_find_their_tokens_by_id():
    batch = _batch("a", "b", "c", "d")
    pending = _pending(batch, [0, 1, 3])  # a, b, d
    batch.remove("a")
    batch.condense()  # d moves from row 3 into row 0
    assert batch.req_ids[:3] == ["d", "b", "c"]
    rows = [0, 1]
    got = pending.indices_of(batch, np.asarray(rows)).tolist()
    assert got == _by_id(pending, batch, rows) == [2, 1]
    assert pending.sampled_device[got].tolist() == [103, 101]  # d's and b's own tokens


def test_a_row_that_did_not_sample_is_never_given_a_neighbours_token():
    batch = _batch("a", "b", "c", "d", "e")
    pending = _pending(batch, [0, 2])  # b, d and e sampled nothing
    with pytest.raises(KeyError):  # b (row 1) would land on c's index by search alone
        pending.indices_of(batch, np.asarray([0, 1]))
    with pytest.raises(KeyError):  # e (row 4) would land one past the end
        pending.indices_of(batch, np.asarray([4]))
