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


class _EagerStep:
    """A captured graph with the sampler inside, stood in for on the CPU: replay re-runs the
    graph's step (model, logits, fused sampler: interpreted) over the static buffers."""

    def __init__(self, graphs: CUDAGraphRunner, n: int) -> None:
        self.graphs, self.n = graphs, n
        self.replays = 0

    def replay(self) -> None:
        self.graphs.outputs[self.n] = self.graphs.step(self.n)
        self.replays += 1


def _sampling_graphs(llm: LLM, sizes: list[int]) -> CUDAGraphRunner:
    """Graphs with the sampler, as ``capture_cuda_graphs`` makes them, replayed by ``_EagerStep``."""
    runner = _runner(llm)
    max_len = llm.cfg.max_model_len
    graphs = CUDAGraphRunner(
        runner.model, sizes, -(-max_len // runner.block_size), max_len, runner.device, runner.model.compute_logits
    )
    for n in graphs.sizes:
        graphs.outputs[n] = graphs.step(n)
        graphs.graphs[n] = _EagerStep(graphs, n)
    runner.cuda_graphs = graphs
    return graphs


def _counted(run_sampled, calls: list[int]):
    """``run_sampled`` that records each call's number of rows in ``calls``."""

    def run(*args):
        calls.append(args[3].shape[0])
        return run_sampled(*args)

    return run


SAMPLED_PARAMS = [
    SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=0.9, seed=3, max_tokens=6, ignore_eos=True),
    SamplingParams(temperature=0.6, seed=8, max_tokens=4, ignore_eos=True),
]


def _cpu_llm(llama_dir) -> LLM:
    return LLM(
        model=str(llama_dir),
        dtype="float32",
        num_gpu_blocks_override=32,
        block_size=8,
        attention_backend="triton",  # interpreted: the graphs' static metadata needs no host work
        max_num_seqs=4,
        overrides=["compilation.fused_sampler=true"],
    )


def test_decode_steps_sample_inside_the_graph_with_the_eager_steps_tokens(llama_dir):
    """The runner's in-graph sampling path on the CPU, with the graph replay stood in for: greedy
    and seeded requests get the tokens of the eager steps, and plain decode steps sample in the
    graph; a step with logprobs replays the graph but samples the usual way."""
    prompts = ["def f(x):", "class A:", "import os"]
    outs = {}
    for in_graph in (False, True):
        llm = _cpu_llm(llama_dir)
        graphs = _sampling_graphs(llm, [1, 2, 4]) if in_graph else None
        calls = []
        if graphs is not None:
            graphs.run_sampled = _counted(graphs.run_sampled, calls)
        outs[in_graph] = [o.outputs[0].token_ids for o in llm.generate(prompts, SAMPLED_PARAMS, use_tqdm=False)]
        if graphs is not None:
            assert calls and set(calls) <= {1, 2, 3}  # decode steps of 3, then fewer rows (padded to 4, 2)
            replays = sum(g.replays for g in graphs.graphs.values())
            before = len(calls)
            logprobs = SamplingParams(temperature=0, max_tokens=3, logprobs=1, ignore_eos=True)
            out = llm.generate(prompts[:1], logprobs, use_tqdm=False)[0].outputs[0]
            assert len(out.logprobs) == 3 and len(calls) == before  # sampled outside the graph
            assert sum(g.replays for g in graphs.graphs.values()) > replays
        llm.shutdown()
    assert outs[True] == outs[False]


@pytest.mark.gpu
def test_graphs_with_the_sampler_inside_give_the_eager_tokens(llama_dir):
    """compilation.fused_sampler on (the CUDA default): decode steps replay the model and the
    sampler in one graph; greedy and seeded requests get the eager engine's tokens."""
    prompts = [f"def f{i}(x):" + " x" * i for i in range(5)]
    params = [*SAMPLED_PARAMS, SAMPLED_PARAMS[1], SAMPLED_PARAMS[0]]
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
        graphs = _runner(llm).cuda_graphs
        assert (graphs is None) == eager and (eager or graphs.vocab_size is not None)
        outs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        llm.shutdown()
    assert outs[True] == outs[False]
