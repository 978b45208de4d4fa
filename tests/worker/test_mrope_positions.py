"""The runner's (3, T) M-RoPE positions over chunked prefills, decodes and batch changes,
against transformers' ``get_rope_index`` of each whole prompt (decode: p + its delta)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

from minivllm.core.scheduler_output import NewRequestData
from minivllm.models.qwen2_vl import mrope_input_positions
from minivllm.request import RequestId
from minivllm.sampling_params import SamplingParams
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.mm_runner import MRopePositions
from minivllm.worker.step_inputs import StepInputBuilder
from tests.models.qwen2_vl_checkpoint import IMAGE_TOKEN, MERGE, image_prompt, tiny_qwen2_vl_config

BLOCK = 8
CPU = torch.device("cpu")


def _expected(prompt: list[int], grids) -> tuple[np.ndarray, int]:
    """transformers' positions of the whole prompt and its delta (text only: arange, 0)."""
    if not grids:
        return np.tile(np.arange(len(prompt)), (3, 1)), 0
    hf = Qwen2VLModel(tiny_qwen2_vl_config())
    ids = torch.tensor([prompt])
    positions, delta = hf.get_rope_index(ids, (ids == IMAGE_TOKEN).int(), image_grid_thw=torch.tensor(grids))
    return positions[:, 0].numpy(), int(delta[0, 0])


def test_step_positions_follow_each_prompt_through_chunks_and_decodes():
    model = SimpleNamespace(get_mrope_input_positions=lambda ids, f: mrope_input_positions(len(ids), f, MERGE))
    grids = {"a": [(1, 4, 4), (1, 6, 4)], "b": [], "c": [(1, 4, 8)]}
    prompts = {
        "a": image_prompt([3, 5, 2], grids["a"]),
        "b": image_prompt([5], []),
        "c": image_prompt([2, 3], grids["c"]),
    }
    expected = {r: _expected(prompts[r][0], grids[r]) for r in prompts}
    batch = InputBatch(4, 128, 16, CPU)
    mrope = MRopePositions(model, CPU)
    batch.register(mrope)  # as the runner does: the positions follow the batch's requests
    builder = StepInputBuilder(64, 4, 16, BLOCK, CPU)
    for r, (ids, features) in prompts.items():
        batch.add(
            NewRequestData(RequestId(r), ids, len(ids), SamplingParams(), list(range(16)), 0, mm_features=features)
        )

    def step(counts: dict[str, int]) -> None:
        rows = np.asarray(sorted(batch.row_of[RequestId(r)] for r in counts))
        query_lens = np.asarray([counts[batch.req_ids[row]] for row in rows], dtype=np.int32)
        inputs = builder.build(batch, rows, query_lens)
        got = mrope.positions(batch, inputs).numpy()  # (3, T)
        for i, (p, row) in enumerate(zip(inputs.token_positions, inputs.token_rows)):
            prompt_positions, delta = expected[batch.req_ids[row]]
            want = prompt_positions[:, p] if p < prompt_positions.shape[1] else np.full(3, p + delta)
            assert (got[:, i] == want).all(), (batch.req_ids[row], p, got[:, i], want)
        for row, n in zip(rows, query_lens):
            batch.num_computed_tokens[row] += n
            if batch.num_computed_tokens[row] >= batch.num_tokens[row]:  # sampled: one more token known
                batch.append_tokens(np.asarray([row]), np.asarray([11]))

    image_a = prompts["a"][1][0]
    step({"a": image_a.offset + 2, "b": 5, "c": 3})  # splits a's first image; b's whole prompt
    step({"a": len(prompts["a"][0]) - image_a.offset - 2, "b": 1, "c": 1})  # a's rest; b decodes
    batch.remove(RequestId("b"))  # and from the registered positions
    batch.condense()  # a row moves: the per-row deltas follow their requests
    step({"a": 1, "c": len(prompts["c"][0]) - 4})
    for _ in range(2):
        step({"a": 1, "c": 1})
    assert expected["a"][1] < 0 and expected["c"][1] < 0  # images shorten the span: the deltas mattered
