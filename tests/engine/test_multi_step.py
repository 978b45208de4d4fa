"""Multi-step decoding (``scheduler.num_scheduler_steps``) end to end: the engine's outputs
equal the one-step loop's, token for token, with stop strings, stop tokens, seeds, n=2,
top-p, an abort, preemption, prefix caching and chunked prefill, synchronous and async;
greedy tokens equal transformers' through the C decode stack and the modules, and on the
families whose decode carries more than a KV cache (a sliding window, linear-attention
states, MLA's latent cache); tp=2 equals tp=1."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.llm_engine import LLMEngine
from tests.engine.test_async_scheduling import make_engine, run, workload
from tests.hf_reference import hf_greedy
from tests.model_configs import deepseek_v2_config, mistral_config, qwen3_next_config

STEPS = 4


def spy_on_steps(engine: LLMEngine) -> list[int]:
    """Each scheduled batch's ``num_steps``, as the engine runs."""
    scheduler, seen = engine.core.scheduler, []
    schedule = scheduler.schedule

    def recording():
        out = schedule()
        if not out.is_empty:
            seen.append(out.num_steps)
        return out

    scheduler.schedule = recording
    return seen


@pytest.fixture(scope="module")
def probe(llama_dir):
    engine = make_engine(llama_dir, async_scheduling=False, num_blocks=256)
    finals, _ = run(engine, [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)] * 6)
    engine.shutdown()
    return finals


@pytest.fixture(scope="module")
def one_step(llama_dir, probe):
    engine = make_engine(llama_dir, async_scheduling=False)
    finals, aborted = run(engine, workload(probe), abort_id="3", abort_after=3)
    engine.shutdown()
    return finals, aborted


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_the_outputs_equal_the_one_step_loops(llama_dir, probe, one_step, async_scheduling):
    engine = make_engine(llama_dir, async_scheduling, overrides=[f"scheduler.num_scheduler_steps={STEPS}"])
    seen = spy_on_steps(engine)
    finals, aborted = run(engine, workload(probe), abort_id="3", abort_after=3)
    preemptions = engine.core.scheduler.num_preemptions
    engine.shutdown()
    assert finals == one_step[0]  # stop strings, stop ids, seeds, n=2, top-p, max_tokens=1
    assert aborted[:3] == one_step[1][:3]  # the abort lands after a batch of up to 4 tokens
    assert preemptions > 0 and STEPS in seen and 1 in seen  # the cache is too small for every request


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_request_at_the_context_limit_bounds_the_batch(llama_dir, async_scheduling):
    """One request a few tokens from ``max_model_len`` beside one that wants many more: the batch
    runs no more steps than the first can take (its last token is the context's last), and both
    give the one-step loop's tokens."""
    prompts = [list(range(20, 49)), [5, 17, 9]]  # 29 tokens of max_model_len=32, and 3
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)  # capped by the context
    outputs = {}
    for steps in (1, STEPS):
        llm = LLM(
            model=str(llama_dir),
            dtype="float32",
            block_size=4,
            max_model_len=32,
            num_scheduler_steps=steps,
            async_scheduling=async_scheduling,
        )
        try:
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        finally:
            llm.shutdown()
        outputs[steps] = [o.outputs[0].token_ids for o in outs]
    assert outputs[STEPS] == outputs[1]
    assert [len(t) for t in outputs[1]] == [3, 29]


@pytest.mark.parametrize("c_stack", ["null", "false"], ids=["c-decode-stack", "modules"])
def test_greedy_tokens_and_logprobs_match_transformers(llama_dir, c_stack):
    prompts = [[5, 17, 9, 42, 8], [7, 7, 3], list(range(20, 43))]
    ref = hf_greedy(llama_dir, prompts, 11)
    llm = LLM(
        model=str(llama_dir),
        dtype="float32",
        block_size=4,
        num_scheduler_steps=STEPS,
        overrides=[f"device.cpu_fused_decode={c_stack}"],
    )
    try:
        seen = spy_on_steps(llm.llm_engine)
        params = SamplingParams(temperature=0, max_tokens=11, ignore_eos=True, logprobs=0)
        greedy = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=11))
        with_logprobs = llm.generate([{"prompt_token_ids": p} for p in prompts[:1]], params, use_tqdm=False)
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in greedy] == [tokens for tokens, _ in ref]
    assert seen.count(STEPS) >= 4  # 10 tokens after each prefill: batches of 4, 4, then 2
    out = with_logprobs[0].outputs[0]  # a logprob for every step's token
    assert len(out.logprobs) == len(out.token_ids) == 11
    assert [lp[t] for lp, t in zip(out.logprobs, out.token_ids)] == pytest.approx(ref[0][1], abs=1e-4)


@pytest.mark.parametrize(
    "name, config, extra",
    [
        ("mistral-window5-mqa", mistral_config, {}),
        ("qwen3-next", qwen3_next_config, dict(max_model_len=96)),
        ("deepseek-v2-lite-mla-greedy-router", deepseek_v2_config, {}),
    ],
    ids=["sliding-window", "linear-attention-states", "mla"],
)
def test_families_with_more_than_a_kv_cache_match_transformers(make_checkpoint, name, config, extra):
    ckpt = make_checkpoint(name, config())
    prompts = [[5, 17, 9, 42, 8, 11, 30, 2, 9], [7, 7, 3]]
    ref = hf_greedy(ckpt, prompts, 10)
    llm = LLM(model=str(ckpt), dtype="float32", block_size=4, num_scheduler_steps=STEPS, **extra)
    try:
        seen = spy_on_steps(llm.llm_engine)
        params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outs] == [tokens for tokens, _ in ref]
    assert STEPS in seen


def test_tensor_parallel_equals_one_rank_one_step(llama_dir):
    prompts = [[5, 17, 9, 42, 8], [7, 7, 3], list(range(20, 43))]
    params = [
        SamplingParams(temperature=0, max_tokens=9, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.8, seed=4, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.7, seed=8, max_tokens=7, ignore_eos=True),
    ]
    outputs = {}
    for tp, steps in ((1, 1), (2, STEPS)):
        llm = LLM(
            model=str(llama_dir), dtype="float32", block_size=4, tensor_parallel_size=tp, num_scheduler_steps=steps
        )
        try:
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        finally:
            llm.shutdown()
        outputs[tp] = [o.outputs[0].token_ids for o in outs]
    assert outputs[2] == outputs[1]
    assert [len(t) for t in outputs[1]] == [9, 12, 7]


@pytest.mark.gpu
def test_cuda_graphs_replay_every_step_and_equal_eager_one_step_decoding(llama_dir):
    prompts = [f"def f{i}(x):" + " x" * i for i in range(5)]
    params = SamplingParams(temperature=0, max_tokens=13, ignore_eos=True)
    outs, replays = {}, []
    for eager, steps in ((True, 1), (False, STEPS)):
        llm = LLM(
            model=str(llama_dir),
            dtype="bfloat16",
            num_gpu_blocks_override=256,
            enforce_eager=eager,
            attention_backend="triton",
            cuda_graph_sizes=[1, 2, 4, 8],
            num_scheduler_steps=steps,
        )
        graphs = llm.llm_engine.core.executor.worker.model_runner.cuda_graphs
        if graphs is not None:
            run_sampled = graphs.run_sampled

            def counted(*args, _run=run_sampled):
                replays.append(1)
                return _run(*args)

            graphs.run_sampled = counted
        outs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        llm.shutdown()
    assert outs[False] == outs[True]
    assert len(replays) == 12  # every decode step after the prefill's token, in 3 batches of 4
