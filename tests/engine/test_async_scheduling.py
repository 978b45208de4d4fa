"""Async scheduling (step k+1 scheduled before step k's tokens are known) gives
exactly the synchronous loop's outputs: stop strings, stop tokens, EOS,
max_tokens, preemption, prefix caching, an abort mid-run, n=2 and seeds."""

from __future__ import annotations

import pytest

from minivllm.config.store import build_config
from minivllm.engine.llm_engine import LLMEngine
from minivllm.sampling_params import RequestOutputKind, SamplingParams

PROMPTS = [
    "def fibonacci(n):\n",
    "class Stack:\n    def __init__(self):\n",
    "for line in open(path):\n",
    "import os\nimport sys\n",
    "def fibonacci(n):\n    if n < 2:\n",  # shares a prefix with the first
    "return self.data\n",
]


def make_engine(
    llama_dir, async_scheduling: bool, num_blocks: int = 14, fused_sampler: bool = False, overrides: tuple = ()
) -> LLMEngine:
    return LLMEngine(
        build_config(
            [
                f"model.path={llama_dir}",
                "model.dtype=float32",
                "cache.block_size=4",
                f"cache.num_gpu_blocks_override={num_blocks}",
                "scheduler.max_num_seqs=6",
                "scheduler.max_num_batched_tokens=32",
                "scheduler.log_stats_interval=0",
                f"scheduler.async_scheduling={str(async_scheduling).lower()}",
                f"compilation.fused_sampler={str(fused_sampler).lower()}",  # the Triton sampler, interpreted
                *overrides,
            ]
        )
    )


def run(engine: LLMEngine, params: list[SamplingParams], abort_id: str | None = None, abort_after: int = 3):
    """Final outputs by request id, plus the tokens an aborted request had when aborted."""
    for i, (prompt, p) in enumerate(zip(PROMPTS, params)):
        engine.add_request(str(i), prompt, p)
    finals, aborted_tokens = {}, None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == abort_id and not out.finished and len(out.outputs[0].token_ids) >= abort_after:
                aborted_tokens = out.outputs[0].token_ids
                engine.abort_request(abort_id)
            elif out.finished:
                finals[out.request_id] = [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in out.outputs]
    assert engine.core.scheduler.kv.num_free_blocks == engine.num_kv_blocks  # nothing leaked
    return finals, aborted_tokens


def workload(probe: dict) -> list[SamplingParams]:
    """Stop conditions taken from a free run (``probe``), so that each one really triggers."""
    text0 = probe["0"][0][1]
    tokens2 = probe["2"][0][0]
    final = RequestOutputKind.FINAL_ONLY
    return [
        SamplingParams(
            temperature=0, max_tokens=20, stop=[text0[len(text0) // 2 : len(text0) // 2 + 3]], output_kind=final
        ),
        SamplingParams(temperature=1.0, seed=11, n=2, max_tokens=16, output_kind=final),
        SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[tokens2[5]], output_kind=final),
        SamplingParams(temperature=0, max_tokens=24, output_kind=RequestOutputKind.CUMULATIVE),  # aborted
        SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=18, output_kind=final),
        SamplingParams(temperature=0, max_tokens=1, output_kind=final),
    ]


@pytest.fixture(scope="module")
def probe(llama_dir):
    engine = make_engine(llama_dir, async_scheduling=False, num_blocks=256)
    finals, _ = run(engine, [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)] * len(PROMPTS))
    engine.shutdown()
    return finals


@pytest.mark.parametrize("fused_sampler", [False, True], ids=["torch-sampler", "fused-sampler"])
def test_async_scheduling_equals_the_synchronous_loop(llama_dir, probe, fused_sampler):
    results = {}
    for mode in (False, True):
        engine = make_engine(llama_dir, async_scheduling=mode, fused_sampler=fused_sampler)
        results[mode] = run(engine, workload(probe), abort_id="3")
        results[mode] += (engine.core.scheduler.num_preemptions,)
        engine.shutdown()
    (sync_finals, sync_aborted, sync_preempt), (async_finals, async_aborted, async_preempt) = (
        results[False],
        results[True],
    )
    assert sync_preempt > 0 and async_preempt > 0  # the cache is too small for the whole batch
    assert async_finals == sync_finals
    assert async_aborted == sync_aborted and len(sync_aborted) >= 3
    assert "3" not in sync_finals
    reasons = {c[2] for outs in sync_finals.values() for c in outs}
    assert {"stop", "length"} <= reasons
    assert sync_finals["0"][0][3] is not None and sync_finals["2"][0][3] == probe["2"][0][0][5]
