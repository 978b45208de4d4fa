"""One step's flat inputs from the persistent batch: exact ids, positions, slots,
query starts, sequence lengths, block tables and sampling rows."""

from __future__ import annotations

import numpy as np
import torch

from minivllm.core.scheduler_output import NewRequestData
from minivllm.request import RequestId
from minivllm.sampling_params import SamplingParams
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.step_inputs import StepInputBuilder

CPU = torch.device("cpu")
BLOCK = 4


def make_batch() -> InputBatch:
    batch = InputBatch(max_num_reqs=4, max_model_len=16, max_blocks_per_req=4, device=CPU)
    # a: 6 known tokens, 5 computed -> decodes its last token; blocks 7, 2
    batch.add(NewRequestData(RequestId("a"), [11, 12, 13, 14, 15, 16], 6, SamplingParams(), [7, 2], 5))
    # b: a 7-token prompt, first chunk of 3 (does not sample); blocks 5, 1
    batch.add(NewRequestData(RequestId("b"), [21, 22, 23, 24, 25, 26, 27], 7, SamplingParams(), [5, 1], 0))
    return batch


def test_mixed_decode_and_prefill_chunk():
    builder = StepInputBuilder(max_num_tokens=16, max_num_reqs=4, max_blocks_per_req=4, block_size=BLOCK, device=CPU)
    step = builder.build(make_batch(), np.array([0, 1]), np.array([1, 3], dtype=np.int32))
    assert step.input_ids.tolist() == [16, 21, 22, 23]
    assert step.positions.tolist() == [5, 0, 1, 2]
    # position 5 of a: block 2 (its second), offset 1; b's positions 0-2 in block 5
    assert step.meta.slot_mapping.tolist() == [2 * BLOCK + 1, 5 * BLOCK, 5 * BLOCK + 1, 5 * BLOCK + 2]
    assert step.meta.query_start_loc.tolist() == [0, 1, 4]
    assert step.meta.seq_lens.tolist() == [6, 3]
    assert step.meta.block_tables.tolist() == [[7, 2], [5, 1]]
    assert (step.meta.max_query_len, step.meta.max_seq_len) == (3, 6)
    assert step.sample_idx.tolist() == [0]  # b is mid-prompt
    assert step.logits_index.tolist() == [0]
    assert step.placeholders is None

    assert step.meta.state_indices is None and step.meta.has_initial_state is None  # no state slots asked for


def test_hybrid_models_state_slots_travel_with_the_step():
    """A hybrid model's step carries each row's state slot and whether it continues from it (a
    decode token: yes; a first prefill chunk: no) beside the other inputs, in step order."""
    builder = StepInputBuilder(max_num_tokens=16, max_num_reqs=4, max_blocks_per_req=4, block_size=BLOCK, device=CPU)
    step = builder.build(make_batch(), np.array([0, 1]), np.array([1, 3], dtype=np.int32), state_slots=np.array([3, 0]))
    assert step.meta.state_indices.tolist() == [3, 0] and step.meta.state_indices.dtype == torch.int32
    assert step.meta.has_initial_state.tolist() == [True, False] and step.meta.has_initial_state.dtype == torch.bool
    assert step.meta.block_tables.tolist() == [[7, 2], [5, 1]]  # the parts before them unchanged
    batch = make_batch()
    batch.num_computed_tokens[1] = 3  # b's second chunk continues from its slot
    step = builder.build(batch, np.array([1]), np.array([4], dtype=np.int32), state_slots=np.array([2]))
    assert step.meta.state_indices.tolist() == [2] and step.meta.has_initial_state.tolist() == [True]


def test_a_subset_of_rows_and_the_last_prefill_chunk_samples():
    builder = StepInputBuilder(16, 4, 4, BLOCK, CPU)
    batch = make_batch()
    batch.num_computed_tokens[1] = 3
    step = builder.build(batch, np.array([1]), np.array([4], dtype=np.int32))
    assert step.input_ids.tolist() == [24, 25, 26, 27]
    assert step.meta.slot_mapping.tolist() == [5 * BLOCK + 3, 1 * BLOCK, 1 * BLOCK + 1, 1 * BLOCK + 2]
    assert step.sample_idx.tolist() == [0] and step.logits_index.tolist() == [3]


def test_tokens_past_the_known_ones_are_placeholders_from_the_last_sample():
    builder = StepInputBuilder(16, 4, 4, BLOCK, CPU)
    batch = make_batch()
    batch.num_computed_tokens[0] = 6  # a's token 6 was sampled by a step whose output is not in yet
    step = builder.build(batch, np.array([0]), np.array([1], dtype=np.int32), lambda rows: rows + 2)
    dst, src = step.placeholders
    assert dst.tolist() == [0] and src.tolist() == [2]  # row 0 -> index 2 of the last step's samples
    assert step.positions.tolist() == [6] and step.sample_idx.tolist() == [0]


def _reference_decode(batch: InputBatch, rows: list[int]) -> dict:
    """A one-token-per-row step computed row by row, the plain way."""
    pos = [int(batch.num_computed_tokens[r]) for r in rows]
    tables = [batch.block_table.table[r, : batch.block_table.num_blocks[r]].tolist() for r in rows]
    width = max(len(t) for t in tables)
    sample = [i for i, r in enumerate(rows) if pos[i] + 1 >= batch.num_tokens[r]]
    return {
        "ids": [int(batch.token_ids[r, p]) for r, p in zip(rows, pos)],
        "pos": pos,
        "slots": [tables[i][p // BLOCK] * BLOCK + p % BLOCK for i, p in enumerate(pos)],
        "qsl": list(range(len(rows) + 1)),
        "seq": [p + 1 for p in pos],
        "tables": [t + [0] * (width - len(t)) for t in tables],
        "sample": sample,
        "logits": sample,
        "max": (1, max(pos) + 1),
    }


def _decode_step(step) -> dict:
    meta = step.meta
    return {
        "ids": step.input_ids.tolist(),
        "pos": step.positions.tolist(),
        "slots": meta.slot_mapping.tolist(),
        "qsl": meta.query_start_loc.tolist(),
        "seq": meta.seq_lens.tolist(),
        "tables": meta.block_tables.tolist(),
        "sample": step.sample_idx.tolist(),
        "logits": step.logits_index.tolist(),
        "max": (meta.max_query_len, meta.max_seq_len),
    }


def test_decode_steps_over_all_rows_and_over_a_subset_equal_the_row_by_row_reference():
    """Rows 0 .. B-1 read slices of the batch, other rows gather; both against the
    plain computation, with a one-token prefill chunk that must not sample."""
    batch = make_batch()
    batch.num_computed_tokens[1] = 3  # b: a 1-token chunk of its 7-token prompt
    batch.add(NewRequestData(RequestId("c"), [31, 32, 33, 34, 35], 5, SamplingParams(), [3, 6], 4))
    for rows in ([0, 1, 2], [0, 2], [1, 2]):
        for num_tokens in (None, len(rows)):
            builder = StepInputBuilder(16, 4, 4, BLOCK, CPU)
            ones = np.ones(len(rows), dtype=np.int32)
            step = builder.build(batch, np.asarray(rows), ones, num_tokens=num_tokens)
            assert _decode_step(step) == _reference_decode(batch, rows), (rows, num_tokens)
            assert list(step.meta.query_lens_cpu) == [1] * len(rows)
            assert list(step.meta.seq_lens_cpu) == _reference_decode(batch, rows)["seq"]
    # the step keeps its own host arrays: later batch updates do not reach them
    step = StepInputBuilder(16, 4, 4, BLOCK, CPU).build(batch, np.arange(3), np.ones(3, dtype=np.int32))
    batch.num_computed_tokens[:3] += 1
    batch.block_table.append_row(0, [9])
    assert step.token_positions.tolist() == [5, 3, 4]
    assert step.meta.block_tables_cpu.tolist() == [[7, 2], [5, 1], [3, 6]]
    assert step.meta.seq_lens_cpu.tolist() == [6, 4, 5]


def test_a_decode_step_moved_on_by_its_sampled_tokens_equals_the_next_step_built_afresh():
    """``StepInputs.advance`` (multi-step decoding) against the builder's own next step once the
    batch knows the tokens: ids, positions, slots (across block boundaries: a's position 7 is the
    last slot of its block 2, 8 the first of block 9), lengths and the host copies."""
    batch = make_batch()
    batch.num_computed_tokens[1] = 6  # b decodes its last prompt token
    batch.block_table.append_row(0, [9])  # the slots of the steps ahead
    batch.block_table.append_row(1, [6])
    builder = StepInputBuilder(16, 4, 4, BLOCK, CPU)
    ones = np.ones(2, dtype=np.int32)
    step = builder.build(batch, np.arange(2), ones, num_tokens=2)
    for tokens in ([40, 41], [50, 51], [60, 61]):
        step.meta.backend_data = "derived"
        step.advance(torch.tensor(tokens), BLOCK)
        batch.append_tokens(np.arange(2), np.asarray(tokens))
        batch.num_computed_tokens[:2] += 1
        fresh = StepInputBuilder(16, 4, 4, BLOCK, CPU).build(batch, np.arange(2), ones, num_tokens=2)
        assert _decode_step(step) == _decode_step(fresh) == _reference_decode(batch, [0, 1])
        assert list(step.meta.seq_lens_cpu) == list(fresh.meta.seq_lens_cpu)
        assert step.token_positions.tolist() == fresh.token_positions.tolist()
        assert step.meta.backend_data is None and step.meta.mla_plan is None  # the runner derives them again
    assert step.meta.slot_mapping.tolist() == [9 * BLOCK + 0, 6 * BLOCK + 1]  # a at 8, b at 9: their third blocks
