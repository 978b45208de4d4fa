"""CUDA graphs: off on the CPU (the suite runs unchanged), padding logic checked
on the CPU with a stand-in for graph replay, and graphs == eager on a GPU."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.attention.backend import AttentionMetadata
from minivllm.worker.cuda_graphs import CUDAGraphRunner


def _runner(llm: LLM):
    return llm.llm_engine.core.executor.worker.model_runner


def test_graphs_are_off_on_the_cpu_even_when_asked_for(llama_dir):
    for backend in ("torch", "triton"):
        llm = LLM(
            model=str(llama_dir),
            dtype="float32",
            num_gpu_blocks_override=16,
            enforce_eager=False,
            attention_backend=backend,
        )
        assert llm.cfg.compilation.cudagraph is True
        assert not _runner(llm).cuda_graphs_enabled and _runner(llm).cuda_graphs is None
        out = llm.generate(["def f():"], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 3


class _RecordingModel(torch.nn.Module):
    """Hidden state of each row = a function of the inputs it saw, so the test can
    check what the static buffers held at replay."""

    def forward(self, input_ids, positions, meta: AttentionMetadata):
        self.seen = dict(
            slots=meta.slot_mapping.clone(),
            seq_lens=meta.seq_lens.clone(),
            tables=meta.block_tables.clone(),
            max_seq_len=meta.max_seq_len,
        )
        return torch.stack([input_ids * 1000 + positions, meta.seq_lens.long()], dim=1).float()


class _EagerReplay:
    """Stands in for a captured graph on the CPU: replay re-runs the model on the static buffers."""

    def __init__(self, graphs: CUDAGraphRunner, n: int) -> None:
        self.graphs, self.n = graphs, n

    def replay(self) -> None:
        g, n = self.graphs, self.n
        g.outputs[n].copy_(g.model(g.input_ids[:n], g.positions[:n], g._meta(n)))


def test_decode_steps_pad_to_the_next_captured_size():
    model = _RecordingModel()
    graphs = CUDAGraphRunner(
        model, sizes=[1, 2, 4, 8], max_blocks_per_seq=6, max_model_len=96, device=torch.device("cpu")
    )
    assert [graphs.padded_size(b) for b in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, None]
    for n in graphs.sizes:
        graphs.outputs[n] = torch.zeros(n, 2)
        graphs.graphs[n] = _EagerReplay(graphs, n)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([17, 40, 5]),
        query_start_loc=torch.tensor([0, 1, 2, 3], dtype=torch.int32),
        seq_lens=torch.tensor([18, 9, 6], dtype=torch.int32),
        block_tables=torch.tensor([[3, 4], [2, 9], [1, 0]], dtype=torch.int32),
        max_query_len=1,
        max_seq_len=18,
        query_lens_cpu=[1, 1, 1],
        seq_lens_cpu=[18, 9, 6],
    )
    graphs.block_tables.fill_(7)  # stale values from an earlier, wider step
    hidden = graphs.run(torch.tensor([11, 12, 13]), torch.tensor([17, 8, 5]), meta)
    assert hidden.tolist() == [[11017, 18], [12008, 9], [13005, 6]]
    seen = model.seen
    assert seen["slots"].tolist() == [17, 40, 5, -1]  # the padding row writes no KV
    assert seen["seq_lens"].tolist() == [18, 9, 6, 1]
    assert seen["tables"].tolist() == [[3, 4, 0, 0, 0, 0], [2, 9, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0] * 6]
    assert seen["max_seq_len"] == 96  # fixed, so the kernel grid never changes between replays


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 2, 3, 4, 5, 7, 8, 9])
def test_graph_outputs_equal_eager_outputs(llama_dir, batch):
    prompts = [f"def f{i}(x):" + " x" * i for i in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outs = {}
    for eager in (True, False):
        llm = LLM(
            model=str(llama_dir),
            dtype="bfloat16",
            num_gpu_blocks_override=256,
            enforce_eager=eager,
            attention_backend="triton",
            cuda_graph_sizes=[1, 2, 4, 8],
            max_num_seqs=16,
        )
        assert (_runner(llm).cuda_graphs is None) == eager
        outs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        llm.shutdown()
    assert outs[True] == outs[False]
