"""CUDA graphs: off on the CPU (the suite runs unchanged), padding logic checked
on the CPU with a stand-in for graph replay, and graphs == eager on a GPU."""

from __future__ import annotations

import os
import random
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

import minivllm
from minivllm import LLM, SamplingParams
from minivllm.attention.backend import AttentionMetadata
from minivllm.config import build_config
from minivllm.config.device import CompilationConfig, capture_sizes
from minivllm.worker.cuda_graphs import CUDAGraphRunner
from tests.model_configs import deepseek_v3_config, llama_config


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


def test_default_capture_sizes_are_1_2_4_then_every_multiple_of_8():
    assert capture_sizes(None, 40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert capture_sizes(None, 3) == [1, 2, 3]  # max_num_seqs itself, so every batch is covered
    assert capture_sizes(None, 21) == [1, 2, 4, 8, 16, 21]
    sizes = capture_sizes(None, 256)
    assert len(sizes) == 35 and sizes[-1] == 256
    assert all(b - a <= 8 for a, b in zip(sizes, sizes[1:]))


def test_explicit_capture_sizes_win_and_are_validated(llama_dir):
    assert capture_sizes([16, 1, 4, 1000], 64) == [1, 4, 16]  # sorted; past max_num_seqs dropped
    cfg = build_config([f"model.path={llama_dir}", "compilation.cudagraph_capture_sizes=[1,3,5]"])
    assert cfg.compilation.cudagraph_capture_sizes == [1, 3, 5]
    assert build_config([f"model.path={llama_dir}"]).compilation.cudagraph_capture_sizes is None
    with pytest.raises(ValueError, match=r"compilation\.cudagraph_capture_sizes"):
        CompilationConfig(cudagraph_capture_sizes=[1, 0])


def test_default_sizes_pad_nano_vllm_s_shrinking_batch_by_at_most_5_percent():
    """nano-vllm's workload: 256 requests decoding together, output lengths uniform in
    [100, 1024]; the batch shrinks by one as each finishes. Powers of two pad ~20%."""
    rng = random.Random(0)
    lengths = [rng.randint(100, 1024) for _ in range(256)]
    trace = [sum(n > step for n in lengths) for step in range(max(lengths))]

    def padded_fraction(sizes: list[int]) -> float:
        graphs = CUDAGraphRunner(None, sizes, max_blocks_per_seq=1, max_model_len=16, device=torch.device("cpu"))
        replayed = sum(graphs.padded_size(b) for b in trace)
        return (replayed - sum(trace)) / replayed

    assert padded_fraction(capture_sizes(None, 256)) <= 0.05
    assert padded_fraction([1, 2, 4, 8, 16, 32, 64, 128, 256]) > 0.15  # the check can fail


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


class _ShortReplay(_EagerReplay):
    def replay(self) -> None:
        g, n = self.graphs, self.n
        g.short_outputs[n].copy_(g.model(g.input_ids[:n], g.positions[:n], g._meta(n, g.short_len)))


@pytest.mark.parametrize("fused", [False, True], ids=["torch-copies", "staging-kernel"])
def test_decode_steps_pad_to_the_next_captured_size(fused):
    """Both ways of staging a step's inputs (the Triton kernel CUDA uses, here in the
    interpreter, and the torch copies) leave the same values in the rows the graph reads."""
    model = _RecordingModel()
    graphs = CUDAGraphRunner(
        model, sizes=[1, 2, 4, 8], max_blocks_per_seq=6, max_model_len=96, device=torch.device("cpu")
    )
    assert not graphs.fused_staging  # the CPU default: torch copies
    graphs.fused_staging = fused
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
    one = AttentionMetadata(  # then a smaller step: the rows it no longer uses become padding again
        slot_mapping=torch.tensor([9]),
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        seq_lens=torch.tensor([10], dtype=torch.int32),
        block_tables=torch.tensor([[5]], dtype=torch.int32),
        max_query_len=1,
        max_seq_len=10,
        query_lens_cpu=[1],
        seq_lens_cpu=[10],
    )
    graphs.sizes.remove(1)  # pad 1 request to 2 rows
    assert graphs.run(torch.tensor([4]), torch.tensor([9]), one).tolist() == [[4009, 10]]
    assert model.seen["slots"].tolist() == [9, -1] and model.seen["seq_lens"].tolist() == [10, 1]
    assert model.seen["tables"].tolist() == [[5, 0, 0, 0, 0, 0], [0] * 6]


@pytest.mark.parametrize("fused", [False, True], ids=["torch-copies", "staging-kernel"])
def test_block_tables_wider_than_the_graphs_are_cut_to_what_the_step_reads(fused):
    """Slots allocated ahead (multi-step decoding) widen a step's block tables past its sequences'
    blocks, and past the graphs' own width near ``max_seq_len_to_capture``: the step still fits a
    graph, which gets the columns it holds."""
    model = _RecordingModel()
    graphs = CUDAGraphRunner(model, sizes=[1, 2], max_blocks_per_seq=2, max_model_len=32, device=torch.device("cpu"))
    graphs.fused_staging = fused
    for n in graphs.sizes:
        graphs.outputs[n], graphs.graphs[n] = torch.zeros(n, 2), _EagerReplay(graphs, n)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([61, 40]),
        query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32),
        seq_lens=torch.tensor([30, 25], dtype=torch.int32),  # 2 blocks of 16 each; a third allocated ahead
        block_tables=torch.tensor([[3, 4, 8], [2, 9, 6]], dtype=torch.int32),
        max_query_len=1,
        max_seq_len=30,
        query_lens_cpu=[1, 1],
        seq_lens_cpu=[30, 25],
    )
    assert graphs.covers(meta)
    graphs.run(torch.tensor([11, 12]), torch.tensor([29, 24]), meta)
    assert model.seen["tables"].tolist() == [[3, 4], [2, 9]]


def test_short_context_steps_replay_the_short_graph():
    """Sizes whose attention would split at the graphs' context are captured again at a context under
    ``SPLIT_MIN_CONTEXT`` (one launch, no combine pass); a step picks it while every sequence fits."""
    from minivllm.attention.ops.paged_attention_tiles import SPLIT_MIN_CONTEXT

    model = _RecordingModel()
    graphs = CUDAGraphRunner(model, [1, 2, 4], 200, 3200, torch.device("cpu"), short_sizes=[1, 2, 8])
    assert graphs.short_len == SPLIT_MIN_CONTEXT - 1 and graphs.short_sizes == [1, 2]  # 8 is not captured
    for n in graphs.sizes:
        graphs.outputs[n], graphs.graphs[n] = torch.zeros(n, 2), _EagerReplay(graphs, n)
    for n in graphs.short_sizes:
        graphs.short_outputs[n], graphs.short_graphs[n] = torch.zeros(n, 2), _ShortReplay(graphs, n)

    def step(seq_len: int, num_reqs: int = 1) -> int:
        meta = AttentionMetadata(
            slot_mapping=torch.arange(num_reqs),
            query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32),
            seq_lens=torch.full((num_reqs,), seq_len, dtype=torch.int32),
            block_tables=torch.zeros(num_reqs, 2, dtype=torch.int32),
            max_query_len=1,
            max_seq_len=seq_len,
            query_lens_cpu=[1] * num_reqs,
            seq_lens_cpu=[seq_len] * num_reqs,
        )
        graphs.run(torch.arange(num_reqs), torch.arange(num_reqs), meta)
        return model.seen["max_seq_len"]

    assert step(SPLIT_MIN_CONTEXT - 1) == SPLIT_MIN_CONTEXT - 1  # the short graph
    assert step(SPLIT_MIN_CONTEXT) == 3200  # a longer sequence: the full graph, split
    assert step(10, num_reqs=3) == 3200  # 3 pads to 4: no short graph there
    assert CUDAGraphRunner(None, [1], 4, 900, torch.device("cpu"), short_sizes=[1]).short_sizes == []


def test_staging_kernel_rejects_mismatched_inputs():
    graphs = CUDAGraphRunner(None, [1, 2], max_blocks_per_seq=2, max_model_len=32, device=torch.device("cpu"))
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([1, 2]),
        query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32),
        seq_lens=torch.tensor([3, 4], dtype=torch.int32),
        block_tables=torch.zeros(2, 3, dtype=torch.int32),  # wider than the captured tables
        max_query_len=1,
        max_seq_len=4,
        query_lens_cpu=[1, 1],
        seq_lens_cpu=[3, 4],
    )
    with pytest.raises(ValueError, match="block_tables"):
        graphs._stage_fused(torch.tensor([1, 2]), torch.tensor([2, 3]), meta, 2)
    with pytest.raises(ValueError, match="positions must be"):
        graphs._stage_fused(torch.tensor([1, 2]), torch.tensor([2.0, 3.0]), meta, 2)


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
        runner.model,
        sizes,
        -(-max_len // runner.block_size),
        max_len,
        runner.device,
        compute_logits=runner.model.compute_logits,
        states=bool(runner.state_layers),
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


@pytest.mark.gpu
def test_graphs_at_the_default_sizes_equal_eager(llama_dir):
    """Batches between the multiples of 8 (9..17 requests) pad to 16 and 24 rows of the default sizes."""
    prompts = [f"def g{i}(y):" + " y" * (i % 5) for i in range(17)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = {}
    for eager in (True, False):
        llm = LLM(
            model=str(llama_dir),
            dtype="bfloat16",
            num_gpu_blocks_override=256,
            enforce_eager=eager,
            attention_backend="triton",
            max_num_seqs=24,
        )
        if not eager:
            assert _runner(llm).cuda_graphs.sizes == [1, 2, 4, 8, 16, 24]
        outs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        llm.shutdown()
    assert outs[True] == outs[False]


@pytest.mark.gpu
def test_staging_kernel_equals_the_torch_copies_on_cuda():
    cuda, buffers = torch.device("cuda"), {}
    b, n, width = 5, 8, 3
    meta = AttentionMetadata(
        slot_mapping=torch.arange(b, device=cuda) * 7,
        query_start_loc=torch.arange(b + 1, dtype=torch.int32, device=cuda),
        seq_lens=torch.arange(1, b + 1, dtype=torch.int32, device=cuda) * 5,
        block_tables=torch.randint(0, 100, (b, width), dtype=torch.int32, device=cuda),
        max_query_len=1,
        max_seq_len=25,
        query_lens_cpu=[1] * b,
        seq_lens_cpu=[5, 10, 15, 20, 25],
    )
    ids, positions = torch.arange(b, device=cuda) + 100, torch.arange(b, device=cuda) + 4
    for fused in (False, True):
        graphs = CUDAGraphRunner(None, [4, n], max_blocks_per_seq=6, max_model_len=96, device=cuda)
        graphs.block_tables.fill_(7)
        (graphs._stage_fused if fused else graphs._stage_torch)(ids, positions, meta, n)
        buffers[fused] = [graphs.slot_mapping, graphs.seq_lens, graphs.block_tables, graphs.input_ids[:b]]
    for want, got in zip(buffers[False], buffers[True]):
        assert torch.equal(want, got)


@pytest.mark.gpu
def test_a_single_request_crossing_the_split_threshold_equals_eager(make_checkpoint):
    """One request decodes from under ``SPLIT_MIN_CONTEXT`` keys (the short, one-launch graph) past it
    (the split graph): the tokens equal eager decoding."""
    model_dir = make_checkpoint("llama-2k-context", llama_config(max_position_embeddings=2048))
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompt = {"prompt_token_ids": [(7 * i) % 200 + 3 for i in range(1000)]}
    outs = {}
    for eager in (True, False):
        llm = LLM(
            model=str(model_dir),
            dtype="bfloat16",
            num_gpu_blocks_override=512,
            enforce_eager=eager,
            attention_backend="triton",
            max_num_seqs=8,
            max_model_len=2048,
        )
        if not eager:
            assert 1 in _runner(llm).cuda_graphs.short_sizes
        outs[eager] = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
        llm.shutdown()
    assert outs[True] == outs[False]


class _NoHostReads(TorchFunctionMode):
    """Records each call from minivllm's code that a CUDA graph cannot hold: a device value read
    on the host (``item``, ``bool``, ``nonzero``, a boolean-mask index: a synchronization, an
    error during capture) or a host array made a tensor (baked into the graph as a constant).
    Calls from Triton's interpreter are its own business. ``torch.from_numpy`` is no torch
    function: it is swapped for a recording one while the mode is on."""

    HOST_READS = {
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.cpu,
        torch.Tensor.numpy,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.nonzero,
        torch.nonzero,
        torch.tensor,
        torch.as_tensor,
    }

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self._from_numpy = torch.from_numpy

    def __enter__(self):
        def from_numpy(array):
            self._record(torch.from_numpy, sys._getframe(1))
            return self._from_numpy(array)

        torch.from_numpy = from_numpy
        return super().__enter__()

    def __exit__(self, *exc):
        torch.from_numpy = self._from_numpy
        return super().__exit__(*exc)

    def _record(self, func, frame) -> None:
        if frame.f_code.co_filename.startswith(os.path.dirname(minivllm.__file__)):
            self.seen.append(f"{func.__name__} at {frame.f_code.co_filename}:{frame.f_lineno}")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        frame = sys._getframe(1)
        if frame.f_code.co_filename.startswith(os.path.dirname(minivllm.__file__)):
            index = args[1] if func is torch.Tensor.__getitem__ else ()
            masks = [i for i in (index if isinstance(index, tuple) else (index,)) if isinstance(i, torch.Tensor)]
            if func in self.HOST_READS or any(m.dtype == torch.bool for m in masks):
                self._record(func, frame)
        return func(*args, **(kwargs or {}))


class _GuardedStep(_EagerStep):
    """``_EagerStep`` that fails on anything ``_NoHostReads`` records: what capture would refuse."""

    def replay(self) -> None:
        with _NoHostReads() as guard:
            super().replay()
        assert not guard.seen, f"a captured step reads the host: {guard.seen}"


def test_the_guard_sees_host_reads_in_minivllm_code():
    """``_NoHostReads`` can fail: the torch MLA path plans its step on the host (here from the
    device's block tables, then from the runner's host copies: the upload is seen too)."""
    from minivllm.attention.mla import mla_attention
    from tests.models.test_deepseek_mla import _mixed_step

    cache, meta, _, gen = _mixed_step(r=16, dr=8)
    T, H = meta.num_tokens, 2
    args = (torch.randn(T, H, 8), torch.randn(T, H, 8), torch.randn(T, 24), cache, meta)
    with _NoHostReads() as guard:
        mla_attention(*args, w_uk=torch.randn(H, 8, 16), w_uv=torch.randn(H, 8, 16), scale=0.3)
    assert any(s.startswith("cpu at") for s in guard.seen)
    meta.mla_plan, meta.block_tables_cpu = None, meta.block_tables.numpy()
    meta.query_start_loc_cpu = meta.query_start_loc.numpy()
    with _NoHostReads() as guard:
        mla_attention(*args, w_uk=torch.randn(H, 8, 16), w_uv=torch.randn(H, 8, 16), scale=0.3)
    assert any(s.startswith("from_numpy at") for s in guard.seen)
    assert torch.from_numpy is guard._from_numpy


def test_mla_decode_steps_replay_in_graphs_with_the_eager_tokens(make_checkpoint, monkeypatch):
    """DeepSeek V3 (MLA) decode steps through the graphs (the model, logits and fused sampler
    over the static buffers, stood in for on the CPU by re-running them under ``_NoHostReads``):
    the Triton latent write and MLA decode kernel read nothing on the host, and greedy and
    seeded requests get the eager engine's tokens. The experts run CUDA's Triton kernel
    (interpreted) in both engines: the CPU's torch loop counts tokens per expert on the host."""
    from minivllm.layers.fused_moe.triton_experts import triton_fused_experts
    from minivllm.models import deepseek_v2

    monkeypatch.setattr(deepseek_v2, "fused_experts", triton_fused_experts)
    ckpt = make_checkpoint("deepseek-v3-mla-yarn-grouped-sigmoid-router", deepseek_v3_config())
    prompts = [{"prompt_token_ids": list(range(10 + i, 13 + 4 * i))} for i in range(3)]
    outs = {}
    for in_graph in (False, True):
        llm = _cpu_llm(ckpt)
        calls = []
        if in_graph:
            graphs = _sampling_graphs(llm, [1, 2, 4])
            for n in graphs.sizes:
                graphs.graphs[n] = _GuardedStep(graphs, n)
            graphs.run_sampled = _counted(graphs.run_sampled, calls)
        outs[in_graph] = [o.outputs[0].token_ids for o in llm.generate(prompts, SAMPLED_PARAMS, use_tqdm=False)]
        assert not in_graph or (calls and set(calls) <= {1, 2, 3})
        llm.shutdown()
    assert outs[True] == outs[False]


@pytest.mark.slow
def test_gpt_oss_decode_steps_replay_in_graphs_with_the_eager_tokens(make_checkpoint, monkeypatch):
    """gpt-oss's decode steps (sinks, sliding layers, the biased experts on CUDA's fused kernel,
    interpreted) through the stood-in, guarded graphs: nothing read on the host, the eager tokens.
    (Its CPU torch loop over the experts reads their token counts on the host: never captured.)"""
    from minivllm.layers.fused_moe.triton_experts import triton_fused_experts
    from minivllm.models.gpt_oss import GptOssExperts
    from tests.model_configs import gpt_oss_config

    def kernel(self, hidden, weights, ids):
        swiglu = (self.alpha, self.limit)
        return triton_fused_experts(hidden, self.w13, self.w2, weights, ids, b13=self.b13, b2=self.b2, swiglu=swiglu)

    monkeypatch.setattr(GptOssExperts, "torch_experts", kernel)
    ckpt = make_checkpoint("gpt-oss", gpt_oss_config())
    prompts = [{"prompt_token_ids": list(range(10 + i, 13 + 4 * i))} for i in range(3)]
    outs = {}
    for in_graph in (False, True):
        llm = _cpu_llm(ckpt)
        calls = []
        if in_graph:
            graphs = _sampling_graphs(llm, [1, 2, 4])
            for n in graphs.sizes:
                graphs.graphs[n] = _GuardedStep(graphs, n)
            graphs.run_sampled = _counted(graphs.run_sampled, calls)
        outs[in_graph] = [o.outputs[0].token_ids for o in llm.generate(prompts, SAMPLED_PARAMS, use_tqdm=False)]
        assert not in_graph or calls
        llm.shutdown()
    assert outs[True] == outs[False]


@pytest.mark.gpu
def test_gpt_oss_graphs_equal_eager(make_checkpoint):
    """gpt-oss on CUDA: decode steps captured with the experts on the fused kernel (its biases and
    clamped SwiGLU), the eager engine's tokens."""
    from tests.model_configs import gpt_oss_config

    ckpt = make_checkpoint("gpt-oss", gpt_oss_config())
    prompts = [{"prompt_token_ids": list(range(10 + i, 13 + 5 * i))} for i in range(5)]
    params = [*SAMPLED_PARAMS, SAMPLED_PARAMS[1], SAMPLED_PARAMS[0]]
    outs = {}
    for eager in (True, False):
        llm = LLM(
            model=str(ckpt),
            dtype="float32",
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


MLA_COMBINED = dict(
    num_gpu_blocks_override=8,
    block_size=8,
    max_model_len=48,
    max_num_batched_tokens=8,
    max_num_seqs=4,
    async_scheduling=True,
    enable_prefix_caching=True,
)
"""Chunked prefill beside decodes, preemption, async scheduling and prefix caching at once."""


def test_mla_graphs_under_async_prefix_cache_chunked_prefill_and_preemption_match_transformers(
    make_checkpoint, monkeypatch
):
    """MLA decode steps replayed from the (stood-in, guarded) graphs beside everything that makes
    steps irregular: async scheduling, an 8-token budget (prefill chunks next to decodes), a cache
    of 8 blocks (preemption) and prefix caching (the workload twice: the second round reads cached
    latents). Every round gives transformers' tokens."""
    from minivllm.layers.fused_moe.triton_experts import triton_fused_experts
    from minivllm.models import deepseek_v2
    from tests.models.test_deepseek_mla import GREEDY, _assert_matches_transformers, _prompts

    monkeypatch.setattr(deepseek_v2, "fused_experts", triton_fused_experts)  # see the test above
    ckpt = make_checkpoint("deepseek-v3-mla-yarn-grouped-sigmoid-router", deepseek_v3_config())
    prompts = _prompts(shared_prefix=8)
    llm = LLM(
        model=str(ckpt),
        dtype="float32",
        attention_backend="triton",
        overrides=["compilation.fused_sampler=true"],
        **MLA_COMBINED,
    )
    try:
        graphs = _sampling_graphs(llm, [1, 2, 4])
        for n in graphs.sizes:
            graphs.graphs[n] = _GuardedStep(graphs, n)
        rounds = [llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False) for _ in range(2)]
        stats = llm.llm_engine.get_stats()
    finally:
        llm.shutdown()
    assert sum(g.replays for g in graphs.graphs.values()) > 0  # logprobs: replayed, sampled outside
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert llm.cfg.async_scheduling
    for outs in rounds:
        _assert_matches_transformers(ckpt, prompts, [o.outputs[0] for o in outs])


@pytest.mark.gpu
@pytest.mark.parametrize("combined", [False, True], ids=["plain", "async-prefix-chunked-preempted"])
def test_mla_graphs_equal_eager(make_checkpoint, combined):
    """DeepSeek V3 (MLA) on CUDA: decode steps are captured (the latent write and the MLA decode
    kernel) and replay the eager engine's tokens, batches padded to the captured sizes; alone and
    with every option that makes steps irregular (the workload twice: the second round cached)."""
    from tests.models.test_deepseek_mla import _prompts

    ckpt = make_checkpoint("deepseek-v3-mla-yarn-grouped-sigmoid-router", deepseek_v3_config())
    prompts = [{"prompt_token_ids": p} for p in _prompts(shared_prefix=8)] + [{"prompt_token_ids": [7, 8, 9]}]
    params = [*SAMPLED_PARAMS, SAMPLED_PARAMS[1], SAMPLED_PARAMS[0]]
    extra = MLA_COMBINED if combined else dict(num_gpu_blocks_override=256, max_num_seqs=16)
    outs = {}
    for eager in (True, False):
        llm = LLM(
            model=str(ckpt),
            dtype="float32",
            enforce_eager=eager,
            attention_backend="triton",
            cuda_graph_sizes=[1, 2, 4, 8],
            **extra,
        )
        assert (_runner(llm).cuda_graphs is None) == eager
        rounds = 2 if combined else 1
        outs[eager] = [
            [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] for _ in range(rounds)
        ]
        stats = llm.llm_engine.get_stats()
        llm.shutdown()
        if combined:
            assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert outs[True] == outs[False]


def test_mla_models_get_no_short_context_graphs(make_checkpoint, llama_dir, monkeypatch):
    """Short-context graphs exist for the paged kernel's split decode; MLA's decode kernel never
    splits, so an MLA model captures each size once (on an H100's 132 multiprocessors)."""
    import types

    from minivllm.worker import model_runner

    monkeypatch.setattr(model_runner, "device_facts", lambda device: types.SimpleNamespace(num_sms=132))
    ckpt = make_checkpoint("deepseek-v3-mla-yarn-grouped-sigmoid-router", deepseek_v3_config())
    splits = {}
    for name, path in (("mla", ckpt), ("llama", llama_dir)):
        llm = LLM(model=str(path), dtype="float32", block_size=8, num_gpu_blocks_override=16)
        try:
            splits[name] = _runner(llm)._split_sizes([1, 2, 4, 8], 4096)
        finally:
            llm.shutdown()
    assert splits["mla"] == [] and splits["llama"]  # the check can fail


def _interpreted_qwen3_next_kernels(monkeypatch) -> None:
    """Qwen3-Next on CUDA's kernels, interpreted: the Gated DeltaNet ops (the torch ones serve the
    CPU) and the fused experts (the CPU's torch loop counts tokens per expert on the host)."""
    from minivllm.layers.fused_moe import layer as fused_moe_layer
    from minivllm.layers.fused_moe.triton_experts import triton_fused_experts
    from minivllm.layers.ops import triton_gated_delta_net
    from minivllm.models import qwen3_next

    monkeypatch.setattr(qwen3_next, "gated_delta_ops", lambda device: triton_gated_delta_net)
    monkeypatch.setattr(fused_moe_layer, "fused_experts", triton_fused_experts)


def _guarded_graphs(llm: LLM, sizes: list[int]) -> CUDAGraphRunner:
    graphs = _sampling_graphs(llm, sizes)
    for n in graphs.sizes:
        graphs.graphs[n] = _GuardedStep(graphs, n)
    return graphs


@pytest.mark.parametrize("fused", [False, True], ids=["torch-copies", "staging-kernel"])
def test_hybrid_models_state_slots_are_staged_with_padding_slot_minus_one(fused):
    """A hybrid model's graphs hold static state slots and continuation flags: a step's values in
    its rows, slot -1 (skipped by the state kernels) and no initial state in the padding rows."""
    graphs = CUDAGraphRunner(
        _RecordingModel(), [1, 2, 4], max_blocks_per_seq=3, max_model_len=12, device=torch.device("cpu"), states=True
    )
    graphs.fused_staging = fused
    assert graphs._meta(4).state_indices.tolist() == [-1] * 4
    graphs.state_indices.fill_(7)  # stale values from a larger step
    graphs.has_initial_state.fill_(True)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([5, 9, 13], dtype=torch.long),
        query_start_loc=torch.arange(4, dtype=torch.int32),
        seq_lens=torch.tensor([2, 3, 4], dtype=torch.int32),
        block_tables=torch.tensor([[1], [2], [3]], dtype=torch.int32),
        max_query_len=1,
        max_seq_len=4,
        query_lens_cpu=[1, 1, 1],
        seq_lens_cpu=[2, 3, 4],
        state_indices=torch.tensor([3, 0, 2], dtype=torch.int32),
        has_initial_state=torch.tensor([True, False, True]),
    )
    if fused:
        graphs._stage_fused(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3]), meta, 4)
    else:
        graphs._stage_torch(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3]), meta, 4)
    assert graphs.state_indices.tolist() == [3, 0, 2, -1]
    assert graphs.has_initial_state.tolist() == [True, False, True, False]
    meta.state_indices = None  # a hybrid model's step without its slots is refused
    with pytest.raises(ValueError, match="state_indices"):
        graphs._stage_fused(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3]), meta, 4)


def test_qwen3_next_decode_steps_replay_in_graphs_with_the_eager_tokens(make_checkpoint, monkeypatch):
    """Qwen3-Next (Gated DeltaNet layers beside a full-attention layer) decode steps through the
    stood-in, guarded graphs: the state slots come from the graphs' static buffers (padding rows
    slot -1), nothing is read on the host, and greedy and seeded requests get the eager tokens.
    The slots reach the device in the step's one staging copy: preparing a step uploads no other
    host array."""
    from tests.model_configs import qwen3_next_config

    _interpreted_qwen3_next_kernels(monkeypatch)
    ckpt = make_checkpoint("qwen3-next", qwen3_next_config())
    prompts = [{"prompt_token_ids": list(range(10 + i, 13 + 4 * i))} for i in range(3)]
    outs = {}
    for in_graph in (False, True):
        llm = _cpu_llm(ckpt)
        calls, uploads = [], []
        if in_graph:
            graphs = _guarded_graphs(llm, [1, 2, 4])
            graphs.run_sampled = _counted(graphs.run_sampled, calls)
            runner = _runner(llm)
            prepare = runner._prepare_inputs

            def guarded_prepare(scheduler_output, prepare=prepare, uploads=uploads):
                with _NoHostReads() as guard:
                    step = prepare(scheduler_output)
                uploads.extend(guard.seen)
                return step

            runner._prepare_inputs = guarded_prepare
        outs[in_graph] = [o.outputs[0].token_ids for o in llm.generate(prompts, SAMPLED_PARAMS, use_tqdm=False)]
        assert not in_graph or (calls and set(calls) <= {1, 2, 3})
        assert not uploads, f"preparing a step uploads host arrays: {uploads}"
        llm.shutdown()
    assert outs[True] == outs[False]


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("async-chunked-8", dict(async_scheduling=True, max_num_batched_tokens=8, enable_chunked_prefill=True)),
        ("async-preemption", dict(async_scheduling=True, num_gpu_blocks_override=12)),
    ],
)
def test_qwen3_next_graphs_under_async_chunked_prefill_and_preemption_match_transformers(
    make_checkpoint, monkeypatch, name, kwargs
):
    """Qwen3-Next decode steps replayed from the (stood-in, guarded) graphs beside what makes steps
    irregular: async scheduling with prefill chunks of 8 next to decodes (mixed steps run eagerly,
    the states carried between them and the replays), and a tiny cache (preemption frees a slot;
    the request comes back, recomputes, and replays again). transformers' greedy tokens."""
    from tests.hf_reference import hf_greedy
    from tests.model_configs import qwen3_next_config

    _interpreted_qwen3_next_kernels(monkeypatch)
    ckpt = make_checkpoint("qwen3-next", qwen3_next_config())
    gen = torch.Generator().manual_seed(17)
    prompts = [torch.randint(4, 500, (n,), generator=gen).tolist() for n in (3, 9, 14)]
    max_tokens = 8
    args = dict(dtype="float32", block_size=4, num_gpu_blocks_override=64, max_model_len=48, max_num_seqs=4)
    llm = LLM(
        model=str(ckpt), attention_backend="triton", overrides=["compilation.fused_sampler=true"], **{**args, **kwargs}
    )
    try:
        graphs = _guarded_graphs(llm, [1, 2, 4])
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        stats = llm.llm_engine.get_stats()
    finally:
        llm.shutdown()
    assert sum(g.replays for g in graphs.graphs.values()) > 0
    assert "preemption" not in name or stats.num_preemptions > 0
    ref = hf_greedy(ckpt, prompts, max_tokens)
    assert [o.outputs[0].token_ids for o in outs] == [tokens for tokens, _ in ref]


@pytest.mark.gpu
@pytest.mark.parametrize("combined", [False, True], ids=["plain", "async-chunked-preempted"])
def test_qwen3_next_graphs_equal_eager(make_checkpoint, combined):
    """Qwen3-Next on CUDA: decode steps are captured (the Triton conv and recurrent delta-rule
    kernels over the graphs' static state slots, padding rows slot -1) and replay the eager
    engine's tokens; alone and with async scheduling, prefill chunks of 8 and preemption."""
    from tests.model_configs import qwen3_next_config

    ckpt = make_checkpoint("qwen3-next", qwen3_next_config())
    prompts = [{"prompt_token_ids": list(range(10 + i, 13 + 5 * i))} for i in range(5)]
    params = [*SAMPLED_PARAMS, SAMPLED_PARAMS[1], SAMPLED_PARAMS[0]]
    extra = dict(num_gpu_blocks_override=256, max_num_seqs=16)
    if combined:
        extra = dict(
            num_gpu_blocks_override=10,
            block_size=4,
            max_model_len=48,
            max_num_seqs=4,
            max_num_batched_tokens=8,
            async_scheduling=True,
        )
    outs = {}
    for eager in (True, False):
        llm = LLM(
            model=str(ckpt),
            dtype="float32",
            enforce_eager=eager,
            attention_backend="triton",
            cuda_graph_sizes=[1, 2, 4, 8],
            **extra,
        )
        assert (_runner(llm).cuda_graphs is None) == eager
        outs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        stats = llm.llm_engine.get_stats()
        llm.shutdown()
        if combined:
            assert stats.num_preemptions > 0
    assert outs[True] == outs[False]


def test_qwen3_next_one_token_prompts_start_their_reused_slots_from_zeros_in_the_graphs(make_checkpoint, monkeypatch):
    """A step of one-token prompts is a decode-shaped step (one query each) replayed from the
    graphs, yet its requests have no state: the staged ``has_initial_state`` says so, and their
    slots, reused from finished requests and holding those requests' states, are read as zeros.
    transformers' greedy tokens."""
    from tests.hf_reference import hf_greedy
    from tests.model_configs import qwen3_next_config

    _interpreted_qwen3_next_kernels(monkeypatch)
    ckpt = make_checkpoint("qwen3-next", qwen3_next_config())
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    llm = _cpu_llm(ckpt)
    try:
        graphs = _guarded_graphs(llm, [1, 2, 4])
        llm.generate([{"prompt_token_ids": list(range(20 + i, 27 + i))} for i in range(3)], params, use_tqdm=False)
        replays = sum(g.replays for g in graphs.graphs.values())
        prompts = [[42], [7], [301]]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        llm.shutdown()
    assert sum(g.replays for g in graphs.graphs.values()) - replays == 3  # the first step replays too
    assert [o.outputs[0].token_ids for o in outs] == [tokens for tokens, _ in hf_greedy(ckpt, prompts, 3)]
