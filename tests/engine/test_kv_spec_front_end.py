"""A front end learns the KV cache (its sliding window included) from the engine process's
ready message, so it never builds the model itself: an AsyncLLM and a data-parallel
LLM over a sliding-window checkpoint, with model building made to fail in the test's process."""

from __future__ import annotations

import pytest

from minivllm import LLM
from minivllm.layers.attention import Attention
from minivllm.models.registry import ModelRegistry
from minivllm.sampling_params import RequestOutputKind, SamplingParams
from tests.model_configs import mistral_config
from tests.serve.harness import one_intra_op_thread

BLOCK_SIZE, NUM_BLOCKS, PROMPT_LEN, MAX_TOKENS = 4, 6, 8, 56
KWARGS = dict(
    dtype="float32",
    device="cpu",
    block_size=BLOCK_SIZE,
    num_gpu_blocks_override=NUM_BLOCKS,
    max_model_len=128,
    max_num_batched_tokens=8,
)
PROMPT = {"prompt_token_ids": list(range(4, 4 + PROMPT_LEN))}


@pytest.fixture
def no_model_here(monkeypatch):
    """Resolving a model class or building an attention layer in this process fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the front-end process built (part of) a model")

    monkeypatch.setattr(ModelRegistry, "resolve", refuse)
    monkeypatch.setattr(Attention, "__init__", refuse)


def test_async_front_end_gets_the_window_from_the_engine_without_a_model(make_checkpoint, make_engine, no_model_here):
    ckpt = make_checkpoint("mistral-window5-mqa", mistral_config())
    with make_engine(ckpt, **KWARGS) as harness:
        engine = harness.engine
        spec = engine.processor.kv_spec
        assert (spec.block_size, spec.num_blocks, spec.sliding_window) == (BLOCK_SIZE, NUM_BLOCKS, 5)
        assert spec.block_bytes > 0  # measured by the worker, for KV connectors
        # 8 + 56 tokens outgrow the 24-token cache: admitted (and run) only because the
        # blocks behind the window go back to the pool
        assert PROMPT_LEN + MAX_TOKENS > NUM_BLOCKS * BLOCK_SIZE
        params = SamplingParams(
            temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY
        )

        async def run():
            outs = [o async for o in engine.generate(PROMPT, params, "w")]
            return outs, await engine.scheduler_stats()

        outs, stats = harness.run(run())
        assert len(outs[-1].outputs[0].token_ids) == MAX_TOKENS and stats.num_preemptions == 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_data_parallel_front_end_gets_the_window_from_its_replicas(make_checkpoint, no_model_here):
    ckpt = make_checkpoint("mistral-window5-mqa", mistral_config())
    with one_intra_op_thread():
        llm = LLM(model=str(ckpt), data_parallel_size=2, **KWARGS)
    try:
        spec = llm.llm_engine.processor.kv_spec
        assert (spec.block_size, spec.num_blocks, spec.sliding_window) == (BLOCK_SIZE, NUM_BLOCKS, 5)
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
        out = llm.generate([PROMPT], params, use_tqdm=False)[0]
        assert len(out.outputs[0].token_ids) == MAX_TOKENS
    finally:
        llm.shutdown()
