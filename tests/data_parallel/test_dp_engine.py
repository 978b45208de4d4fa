"""parallel.dp=2: two engine replicas behind LLM.generate and behind AsyncLLM give
dp=1's outputs for the same seeds, and both replicas receive requests."""

from __future__ import annotations

import asyncio
import time

import pytest

from minivllm import LLM, SamplingParams
from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.vllm_config import VllmConfig
from minivllm.engine.async_llm import AsyncLLM
from minivllm.sampling_params import RequestOutputKind
from tests.serve.harness import one_intra_op_thread

pytestmark = pytest.mark.slow
KWARGS = dict(dtype="float32", block_size=8, num_gpu_blocks_override=64, max_model_len=128)
PROMPTS = ["def fibonacci(n):", "import os\nimport", "class Stack:\n    def push(self", "for i in range(10):"]
PARAMS = [  # greedy, and seeded sampling: neither depends on which replica runs the request
    SamplingParams(temperature=0, max_tokens=10, logprobs=2),
    SamplingParams(temperature=0.9, seed=11, max_tokens=10),
] * 2


@pytest.fixture(scope="module")
def reference(llama_dir):
    llm = LLM(model=str(llama_dir), **KWARGS)
    yield llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    llm.shutdown()


def _still_alive(replicas, within_s: float = 10.0) -> list:
    """The replicas whose process is still alive ``within_s`` after shutdown returned. shutdown()
    kills a replica that does not stop in time; the bound only absorbs the moment it takes the
    process's exit status to reach this process (seen once on a loaded machine)."""
    deadline = time.monotonic() + within_s
    while (alive := [c for c in replicas if c.is_alive()]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _same(expected, actual) -> None:
    for want, got in zip(expected, actual, strict=True):
        assert got.prompt == want.prompt and got.prompt_token_ids == want.prompt_token_ids
        assert got.outputs[0].token_ids == want.outputs[0].token_ids, want.prompt
        assert got.outputs[0].text == want.outputs[0].text


@pytest.mark.timeout(240)
def test_llm_dp2_equals_dp1_and_uses_both_replicas(llama_dir, reference):
    with one_intra_op_thread():
        llm = LLM(model=str(llama_dir), data_parallel_size=2, **KWARGS)
    try:
        _same(reference, llm.generate(PROMPTS, PARAMS, use_tqdm=False))
        engine = llm.llm_engine
        assert engine.balancer.routed == [2, 2]
        per_replica = engine.replica_stats()  # the replicas' own counts
        assert all(s.prefix_cache_queries > 0 for s in per_replica), per_replica
        assert engine.scheduler_stats().prefix_cache_queries == sum(s.prefix_cache_queries for s in per_replica)
        assert llm.collective_rpc(lambda worker: worker.cfg.parallel.dp_rank) == [0, 1]  # one rank per replica
    finally:
        llm.shutdown()
    assert not _still_alive(engine.replicas)


@pytest.mark.timeout(240)
def test_async_llm_dp2_serves_through_one_front_end(llama_dir, reference):
    cfg = VllmConfig.from_dictconfig(config_from_kwargs(str(llama_dir), data_parallel_size=2, **KWARGS))
    with one_intra_op_thread():
        engine = AsyncLLM(cfg)

    async def one(i: int):
        params = PARAMS[i].clone()
        params.output_kind = RequestOutputKind.FINAL_ONLY
        return [o async for o in engine.generate(PROMPTS[i], params, f"r{i}")][-1]

    async def run():
        outs = await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))
        return outs, await engine.replica_stats()

    try:
        outputs, per_replica = asyncio.run(run())
        _same(reference, outputs)
        assert engine.balancer.routed == [2, 2] and engine.balancer.load == [0, 0]
        assert all(s.prefix_cache_queries > 0 for s in per_replica), per_replica
        assert len(set(engine.engine_pids)) == 2
    finally:
        engine.shutdown()


def test_dp_with_the_external_launcher_is_refused(llama_dir):
    with pytest.raises(ValueError, match=r"parallel.dp=2: not supported with parallel.backend=external_launcher"):
        LLM(model=str(llama_dir), data_parallel_size=2, distributed_executor_backend="external_launcher", **KWARGS)


POOLING = dict(KWARGS, runner="pooling", disable_log_stats=True)


@pytest.mark.timeout(240)
def test_embed_requests_are_balanced_over_both_replicas_and_equal_dp1(llama_dir):
    """LLM.embed and AsyncLLM.encode: the balancer spreads pooling requests like the others."""
    from minivllm.pooling import PoolingParams

    single = LLM(model=str(llama_dir), **POOLING)
    try:
        want = [o.outputs.embedding for o in single.embed(PROMPTS, use_tqdm=False)]
    finally:
        single.shutdown()
    with one_intra_op_thread():
        llm = LLM(model=str(llama_dir), data_parallel_size=2, **POOLING)
    try:
        got = [o.outputs.embedding for o in llm.embed(PROMPTS, use_tqdm=False)]
        assert llm.llm_engine.balancer.routed == [2, 2] and llm.llm_engine.balancer.load == [0, 0]
    finally:
        llm.shutdown()
    for w, g in zip(want, got, strict=True):
        assert g == pytest.approx(w, abs=1e-5)

    cfg = VllmConfig.from_dictconfig(config_from_kwargs(str(llama_dir), data_parallel_size=2, **POOLING))
    with one_intra_op_thread():
        engine = AsyncLLM(cfg)

    async def run():
        return await asyncio.gather(*(engine.encode(p, PoolingParams(), f"e{i}") for i, p in enumerate(PROMPTS)))

    try:
        outs = asyncio.run(run())
        assert engine.balancer.routed == [2, 2] and engine.balancer.load == [0, 0]
    finally:
        engine.shutdown()
    for w, out in zip(want, outs, strict=True):
        assert out.outputs.data.tolist() == pytest.approx(w, abs=1e-5)


@pytest.mark.timeout(240)
def test_llm_dp2_truncates_a_long_prompt_like_dp1(llama_dir):
    """truncate_prompt_tokens keeps a prompt over max_model_len admissible at dp=2 as at dp=1."""
    long_prompt = "x = x + 1\n" * 40
    params = SamplingParams(temperature=0, max_tokens=6, truncate_prompt_tokens=16)
    single = LLM(model=str(llama_dir), **KWARGS)
    try:
        assert len(single.get_tokenizer().encode(long_prompt)) > KWARGS["max_model_len"]
        want = single.generate(long_prompt, params, use_tqdm=False)
    finally:
        single.shutdown()
    assert len(want[0].prompt_token_ids) == 16
    with one_intra_op_thread():
        llm = LLM(model=str(llama_dir), data_parallel_size=2, **KWARGS)
    try:
        _same(want, llm.generate(long_prompt, params, use_tqdm=False))
    finally:
        llm.shutdown()
