"""A step's sampled tokens held by the persistent batch: where the next step's
placeholders find each request's token, by batch row while the batch is unchanged
and by id once rows moved; and when the batch stores them in its rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.sample.sampler import SamplerOutput
from minivllm.worker.input_batch import InputBatch, SampledTokens
from minivllm.worker.model_runner import PendingOutput
from tests.worker.test_input_batch import CPU, new


def _batch(*req_ids: str) -> InputBatch:
    batch = InputBatch(max_num_reqs=6, max_model_len=8, max_blocks_per_req=2, device=CPU)
    for i, req_id in enumerate(req_ids):
        batch.add(new(req_id, [10 + i], [i]))
    return batch


def _hold(batch: InputBatch, rows: list[int]) -> SampledTokens:
    tokens = torch.tensor([100 + r for r in rows])
    return batch.hold_sampled([batch.req_ids[r] for r in rows], np.asarray(rows), tokens)


def _by_id(sampled: SampledTokens, batch: InputBatch, rows: list[int]) -> list[int]:
    return [sampled.index_of[batch.req_ids[r]] for r in rows]


def _tokens(batch: InputBatch) -> dict[str, list[int]]:
    return {req_id: batch.tokens_of(row) for req_id, row in batch.row_of.items()}


def test_rows_of_an_unchanged_batch_find_their_tokens_as_the_ids_do():
    batch = _batch("a", "b", "c", "d", "e")
    sampled = _hold(batch, [0, 2, 3])  # b and e sampled nothing (mid-prefill)
    rows = [3, 0, 2]
    assert batch.prev_sampled is sampled
    assert batch.prev_sampled_index(np.asarray(rows)).tolist() == _by_id(sampled, batch, rows) == [2, 0, 1]


def test_rows_that_moved_after_the_step_find_their_tokens_by_id():
    batch = _batch("a", "b", "c", "d")
    sampled = _hold(batch, [0, 1, 3])  # a, b, d
    batch.remove("a")
    batch.condense()  # d moves from row 3 into row 0
    assert batch.req_ids[:3] == ["d", "b", "c"]
    rows = [0, 1]
    got = batch.prev_sampled_index(np.asarray(rows)).tolist()
    assert got == _by_id(sampled, batch, rows) == [2, 1]
    assert batch.prev_sampled.device[got].tolist() == [103, 101]  # d's and b's own tokens


def test_a_row_that_did_not_sample_is_never_given_a_neighbours_token():
    batch = _batch("a", "b", "c", "d", "e")
    _hold(batch, [0, 2])  # b, d and e sampled nothing
    with pytest.raises(KeyError):  # b (row 1) would land on c's index by search alone
        batch.prev_sampled_index(np.asarray([0, 1]))
    with pytest.raises(KeyError):  # e (row 4) would land one past the end
        batch.prev_sampled_index(np.asarray([4]))


def test_a_step_is_stored_once_read_and_the_last_unread_one_stays_held():
    """Synchronous: read, then stored in its rows. Async: the next step's ids are held before
    the last ones are read; the older step is stored, the unread newest stays for placeholders."""
    batch = _batch("a", "b")
    first = _hold(batch, [0, 1])
    batch.store_sampled()
    assert batch.prev_sampled is first and _tokens(batch) == {"a": [10], "b": [11]}  # not read: held
    first.read()
    batch.store_sampled()
    assert batch.prev_sampled is None and _tokens(batch) == {"a": [10, 100], "b": [11, 101]}
    second, third = _hold(batch, [0, 1]), _hold(batch, [1])
    batch.store_sampled()  # second was never read, but an older step than the last is always stored
    assert batch.prev_sampled is third and _tokens(batch) == {"a": [10, 100, 100], "b": [11, 101, 101]}
    assert second.host is not None
    batch.store_sampled(wait=True)  # the history of every row, now (logit edits ask for it)
    assert batch.prev_sampled is None and _tokens(batch) == {"a": [10, 100, 100], "b": [11, 101, 101, 101]}


def test_tokens_of_a_step_the_batch_changed_since_go_to_their_requests_still_here():
    batch = _batch("a", "b", "c")
    sampled = _hold(batch, [0, 1, 2])
    batch.remove("a")
    batch.condense()  # c moves into row 0
    sampled.read()
    batch.store_sampled()
    assert _tokens(batch) == {"c": [12, 102], "b": [11, 101]}


def test_a_pending_output_reads_the_held_ids_and_leaves_the_batch_alone():
    batch = _batch("a", "b")
    sampled = _hold(batch, [0, 1])
    before = batch.num_tokens.copy()
    pending = PendingOutput(sampled, SamplerOutput(sampled.device, None, None, None), [None, None], {})
    assert not pending.resolved
    assert pending.result().sampled_token_ids == {"a": [100], "b": [101]}
    assert pending.resolved and sampled.host is not None
    assert (batch.num_tokens == before).all()  # the batch stores them when its next step starts


def test_the_ids_of_several_decode_steps_travel_and_are_stored_as_one():
    """Multi-step decoding holds (S, n) ids: the next step's placeholders read each request's
    last one, the output lists all n per request, and the rows gain them in order."""
    batch = _batch("a", "b")
    tokens = torch.tensor([[100, 101, 102], [200, 201, 202]])
    sampled = batch.hold_sampled(["a", "b"], np.arange(2), tokens)
    assert batch.prev_sampled.device.tolist() == [102, 202]
    pending = PendingOutput(sampled, SamplerOutput(tokens, None, None, None), [None, None], {})
    assert pending.result().sampled_token_ids == {"a": [100, 101, 102], "b": [200, 201, 202]}
    batch.store_sampled()
    assert _tokens(batch) == {"a": [10, 100, 101, 102], "b": [11, 200, 201, 202]}
