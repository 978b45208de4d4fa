"""The persistent batch: rows added, removed, compacted and reused, block tables
grown in place, sampled tokens appended; exact arrays asserted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.core.scheduler_output import NewRequestData
from minivllm.request import RequestId
from minivllm.sampling_params import SamplingParams
from minivllm.worker.input_batch import BlockTable, InputBatch

CPU = torch.device("cpu")


def new(req_id: str, tokens: list[int], blocks: list[int], computed: int = 0, **params) -> NewRequestData:
    return NewRequestData(RequestId(req_id), tokens, len(tokens), SamplingParams(**params), blocks, computed)


def occupied(batch: InputBatch) -> list[str | None]:
    return batch.req_ids[: batch.num_rows]


def test_add_fills_rows_in_order_with_tokens_blocks_and_params():
    batch = InputBatch(max_num_reqs=4, max_model_len=8, max_blocks_per_req=4, device=CPU)
    batch.add(new("a", [5, 6, 7], [3], temperature=0))
    batch.add(new("b", [9], [1, 2], computed=0, temperature=0.5, top_k=3, seed=7))
    assert occupied(batch) == ["a", "b"]
    assert batch.token_ids[:2].tolist() == [[5, 6, 7, 0, 0, 0, 0, 0], [9, 0, 0, 0, 0, 0, 0, 0]]
    assert batch.num_tokens[:2].tolist() == [3, 1]
    assert batch.block_table.table[:2].tolist() == [[3, 0, 0, 0], [1, 2, 0, 0]]
    assert batch.block_table.num_blocks[:2].tolist() == [1, 2]
    assert batch.sampling.columns["temperature"][:2].tolist() == [0.0, 0.5]
    assert batch.sampling.columns["top_k"][:2].tolist() == [0, 3]
    assert batch.sampling.seeded == {batch.row_of["b"]}


def test_remove_leaves_a_hole_that_the_next_request_reuses():
    batch = InputBatch(4, 8, 4, CPU)
    for name in "abc":
        batch.add(new(name, [1, 2], [0]))
    version = batch.version
    assert batch.remove(RequestId("b")) == 1
    assert batch.version > version
    assert occupied(batch) == ["a", None, "c"]
    assert batch.add(new("d", [4], [5])) == 1  # the lowest hole first
    assert occupied(batch) == ["a", "d", "c"]
    assert batch.token_ids[1, :1].tolist() == [4] and batch.block_table.table[1, :1].tolist() == [5]


def test_condense_moves_the_last_rows_into_the_holes():
    batch = InputBatch(6, 8, 4, CPU)
    for i, name in enumerate("abcde"):
        batch.add(new(name, [10 + i] * (i + 1), [i, 20 + i], temperature=0.1 * i))
    batch.remove(RequestId("a"))
    batch.remove(RequestId("c"))
    batch.condense()
    assert occupied(batch) == ["e", "b", "d"]  # e fills row 0 (a's), then d fills row 2 (c's)
    assert batch.num_rows == 3
    assert batch.row_of == {"e": 0, "b": 1, "d": 2}
    assert batch.token_ids[0, :5].tolist() == [14] * 5 and batch.num_tokens[:3].tolist() == [5, 2, 4]
    assert batch.block_table.table[:3, :2].tolist() == [[4, 24], [1, 21], [3, 23]]
    assert np.allclose(batch.sampling.columns["temperature"][:3], [0.4, 0.1, 0.3])
    assert batch.block_table.num_blocks[3:].tolist() == [0, 0, 0]


def test_condense_with_holes_only_at_the_top_just_shrinks():
    batch = InputBatch(4, 8, 4, CPU)
    for name in "abc":
        batch.add(new(name, [1], [0]))
    batch.remove(RequestId("c"))
    batch.remove(RequestId("b"))
    batch.condense()
    assert occupied(batch) == ["a"] and batch.num_rows == 1
    assert batch.add(new("d", [2], [1])) == 1


def test_block_tables_grow_in_place_and_sampled_tokens_are_appended():
    batch = InputBatch(2, 16, 4, CPU)
    batch.add(new("a", [1, 2, 3], [7]))
    batch.add(new("b", [4], [8]))
    batch.block_table.append_row(0, [2, 9])
    assert batch.block_table.table[0].tolist() == [7, 2, 9, 0]
    batch.append_tokens(np.array([1, 0]), np.array([40, 30]))
    assert batch.tokens_of(0) == [1, 2, 3, 30] and batch.tokens_of(1) == [4, 40]


def test_a_full_batch_and_an_overlong_request_are_errors():
    batch = InputBatch(1, 4, 2, CPU)
    batch.add(new("a", [1], [0]))
    try:
        batch.add(new("b", [1], [1]))
    except RuntimeError as e:
        assert "max_num_seqs" in str(e)
    else:
        raise AssertionError("a second request fitted a one-row batch")
    batch.remove(RequestId("a"))
    try:
        batch.add(new("c", [1] * 5, [0, 1]))
    except ValueError as e:
        assert "max_model_len=4" in str(e)
    else:
        raise AssertionError("a 5-token request fitted max_model_len=4")


@pytest.mark.parametrize(
    "new_block_ids",
    [
        [[5], None, [6], []],  # a decode step: some rows filled a block, one each
        [[5], None, [6, 7], []],  # a row given two blocks (a chunk): row by row
    ],
)
def test_append_rows_equals_appending_row_by_row(new_block_ids):
    def filled() -> BlockTable:
        table = BlockTable(4, 5)
        for row, blocks in enumerate([[1], [2, 3], [4], [9]]):
            table.set_row(row, blocks)
        return table

    rows = (3, 0, 2, 1)  # the scheduler's order, not the batch's; a tuple, as InputBatch.rows_of gives
    together, one_by_one = filled(), filled()
    together.append_rows(rows, new_block_ids)
    for row, blocks in zip(rows, new_block_ids):
        if blocks:
            one_by_one.append_row(row, blocks)
    assert np.array_equal(together.table, one_by_one.table)
    assert np.array_equal(together.num_blocks, one_by_one.num_blocks)
    assert together.num_blocks.tolist() != [1, 2, 1, 1]  # something was appended


def test_append_rows_past_the_row_width_is_an_error():
    table = BlockTable(2, 2)
    table.set_row(0, [1])
    table.set_row(1, [2, 3])
    with pytest.raises(ValueError, match="batch row 1: 3 blocks"):
        table.append_rows([0, 1], [[4], [5]])
