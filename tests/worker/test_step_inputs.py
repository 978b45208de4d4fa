"""One step's flat inputs from the persistent batch: exact ids, positions, slots,
query starts, sequence lengths, block tables and sampling rows."""
from __future__ import annotations

import numpy as np
import torch

from minivllm.core.scheduler_output import NewRequestData
from minivllm.engine.request import RequestId
from minivllm.sampling_params import SamplingParams
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.step_inputs import StepInputBuilder

CPU = torch.device("cpu")
BLOCK = 4


def make_batch() -> InputBatch:
    batch = InputBatch(max_num_reqs=4, max_model_len=16, max_blocks_per_req=4)
    # a: 6 known tokens, 5 computed -> decodes its last token; blocks 7, 2
    batch.add(NewRequestData(RequestId("a"), [11, 12, 13, 14, 15, 16], 6, SamplingParams(), [7, 2], 5), CPU)
    # b: a 7-token prompt, first chunk of 3 (does not sample); blocks 5, 1
    batch.add(NewRequestData(RequestId("b"), [21, 22, 23, 24, 25, 26, 27], 7, SamplingParams(), [5, 1], 0), CPU)
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
