"""Speculative decoding end to end: greedy outputs equal the engine without it
(parity model and demo model, preemption forced, prefix caching on), n-gram
drafts are accepted on repetitive text, seeded sampling is reproducible, and
the counters reach get_stats() and the stats line."""

from __future__ import annotations

import pytest

from minivllm.config.store import build_config
from minivllm.engine.llm_engine import LLMEngine
from minivllm.sampling_params import SamplingParams

REPEATING = "class Stack:\n    def push(self, x):\n        self.items.append(x)\n    def push(self, x):\n"
PROMPTS = [
    "def fibonacci(n):\n",
    REPEATING,
    "for line in open(path):\n    print(line)\nfor line in open(path):\n",
    "import os\nimport sys\n",
    "def fibonacci(n):\n    if n < 2:\n",  # shares a prefix with the first
]
SPEC = [
    "speculative=ngram",
    "speculative.prompt_lookup_min=2",
    "speculative.prompt_lookup_max=4",
    "speculative.num_speculative_tokens=3",
]


def make_engine(model: list[str], spec: bool, num_blocks: int, **keys) -> LLMEngine:
    return LLMEngine(
        build_config(
            [
                *model,
                "model.dtype=float32",
                "cache.block_size=4",
                f"cache.num_gpu_blocks_override={num_blocks}",
                "cache.enable_prefix_caching=true",
                "scheduler.max_num_seqs=5",
                "scheduler.max_num_batched_tokens=32",
                "scheduler.log_stats_interval=0",
                *[f"{k}={v}" for k, v in keys.items()],
                *(SPEC if spec else []),
            ]
        )
    )


def run(engine: LLMEngine, params: list[SamplingParams]) -> dict[str, list[int]]:
    for i, (prompt, p) in enumerate(zip(PROMPTS, params)):
        engine.add_request(str(i), prompt, p)
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = [(c.token_ids, c.text, c.finish_reason) for c in out.outputs]
    assert engine.core.scheduler.kv.num_free_blocks == engine.num_kv_blocks  # nothing leaked
    return finals


def check_block_tables_each_step(engine: LLMEngine) -> list[int]:
    """Make the runner assert, every step, that its block tables are the scheduler's
    (rows of requests whose drafts were rolled back included). Returns the step count."""
    runner, kv = engine.core.executor.worker.model_runner, engine.core.scheduler.kv
    update, steps = runner._update_states, []

    def checked(sched):
        update(sched)
        batch = runner.batch
        for req_id, row in batch.row_of.items():
            n = int(batch.block_table.num_blocks[row])
            assert batch.block_table.table[row, :n].tolist() == kv.block_ids(req_id), req_id
        steps.append(1)

    runner._update_states = checked
    return steps


def greedy_params(stop_token: int | None = None, stop: str | None = None) -> list[SamplingParams]:
    """Request 2 stops on ``stop_token``, request 1 on the string ``stop``."""
    return [
        SamplingParams(
            temperature=0,
            max_tokens=24 + 3 * i,
            ignore_eos=True,
            stop_token_ids=[stop_token] if stop_token is not None and i == 2 else [],
            stop=[stop] if stop is not None and i == 1 else None,
        )
        for i in range(len(PROMPTS))
    ]


@pytest.fixture(scope="module")
def models(llama_dir):
    return {"parity-llama": [f"model.path={llama_dir}"], "demo": ["model=demo"]}


@pytest.mark.parametrize("name", ["parity-llama", "demo"])
def test_greedy_equals_no_speculation_with_preemption_and_prefix_caching(models, name):
    plain_engine = make_engine(models[name], spec=False, num_blocks=24)
    plain = run(plain_engine, greedy_params())
    stop = plain["2"][0][0][7]  # a token that really occurs: request 2 stops on it
    text = plain["1"][0][1]
    stop_text = text[len(text) // 2 : len(text) // 2 + 3]  # and request 1 on a string that occurs
    plain = run(make_engine(models[name], spec=False, num_blocks=24), greedy_params(stop, stop_text))
    assert plain["1"][0][2] == "stop" and plain["2"][0][2] == "stop"
    engine = make_engine(models[name], spec=True, num_blocks=24)
    steps = check_block_tables_each_step(engine)
    spec = run(engine, greedy_params(stop, stop_text))
    assert steps
    assert spec == plain
    stats = engine.core.scheduler.stats()
    assert stats.num_preemptions > 0, "the test should force preemption"
    assert stats.prefix_cache_hits > 0
    assert stats.spec_num_draft_tokens > 0


def test_ngram_accepts_many_drafts_on_repetitive_code():
    engine = make_engine(["model=demo"], spec=True, num_blocks=64)
    engine.add_request("r", REPEATING * 2, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    stats = engine.get_stats()
    spec = stats.spec_decoding
    assert spec.num_draft_tokens > 0
    assert spec.acceptance_rate > 0.3
    assert spec.mean_accepted_length > 1.5
    assert "Spec decode acceptance rate" in stats.format()
    assert "Mean accepted length" in stats.format()


@pytest.mark.parametrize("fused", ["false", "true"], ids=["torch-sampler", "fused-sampler"])
def test_seeded_sampling_emits_the_plain_engines_tokens_across_preemptions(models, fused):
    """A verified position draws the noise the plain sampler would draw for it (the request's
    seed and the position), so a seeded request's tokens do not depend on where drafts fell:
    speculation, preemption (which moves the drafts) and the sampler (torch or the fused
    kernel, interpreted) leave them unchanged."""
    params = [
        SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=7 + i, max_tokens=20, ignore_eos=True)
        for i in range(len(PROMPTS))
    ]
    keys = {"compilation.fused_sampler": fused}
    plain = run(make_engine(models["demo"], spec=False, num_blocks=64, **keys), params)
    assert run(make_engine(models["demo"], spec=True, num_blocks=64, **keys), params) == plain
    engine = make_engine(models["demo"], spec=True, num_blocks=24, **keys)
    assert run(engine, params) == plain
    stats = engine.core.scheduler.stats()
    assert stats.num_preemptions > 0 and stats.spec_num_draft_tokens > 0
    assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens  # drafts both kept and rejected
    assert all(len(v[0][0]) == 20 for v in plain.values())


@pytest.mark.parametrize("fused", ["false", "true"], ids=["torch-sampler", "fused-sampler"])
def test_requests_that_may_not_speculate_match_the_plain_engine(models, fused):
    """Logprobs and penalties read the raw distribution or the history: no drafts, same outputs."""
    params = [
        SamplingParams(temperature=0, max_tokens=16, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=16, repetition_penalty=1.3, ignore_eos=True),
        *greedy_params()[2:],
    ]
    keys = {"compilation.fused_sampler": fused}
    assert run(make_engine(models["demo"], spec=True, num_blocks=64, **keys), params) == run(
        make_engine(models["demo"], spec=False, num_blocks=64), params
    )


def test_async_scheduling_with_speculation_is_a_clear_error(models):
    with pytest.raises(ValueError, match="scheduler.async_scheduling=true: not supported"):
        build_config([*models["demo"], *SPEC, "scheduler.async_scheduling=true"])


def test_pipeline_parallelism_and_pooling_with_speculation_are_clear_errors(models):
    with pytest.raises(ValueError, match=r"speculative.method=ngram: not supported with parallel.pp=2"):
        build_config([*models["parity-llama"], *SPEC, "parallel.pp=2"])
    with pytest.raises(ValueError, match=r"speculative.method=ngram: model.runner=pooling"):
        build_config([*models["parity-llama"], *SPEC, "model.runner=pooling"])


def test_metrics_endpoint_exports_the_spec_counters():
    from minivllm.core.stats import SchedulerStats
    from minivllm.serve.metrics import ServerMetrics

    stats = SchedulerStats(spec_decoding=True, spec_num_drafts=4, spec_num_draft_tokens=12, spec_num_accepted_tokens=7)
    text = ServerMetrics("m", "vllm").render(stats).decode()
    assert 'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 12.0' in text
    assert 'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 7.0' in text
    assert 'vllm:spec_decode_num_drafts_total{model_name="m"} 4.0' in text


def test_a_grammar_request_beside_drafted_ones_matches_the_plain_engine():
    """The grammar request decodes one token per step (no drafts) in the same batches as drafted ones."""
    from minivllm import LLM
    from minivllm.structured_output import StructuredOutputsParams

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    params = [
        SamplingParams(temperature=0, max_tokens=24, structured_outputs=StructuredOutputsParams(json=schema)),
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
    ]
    prompts = ["The answer is", REPEATING]
    results = []
    for spec in (None, {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}):
        llm = LLM("demo", dtype="float32", speculative_config=spec)
        results.append([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
        spec_stats = llm.llm_engine.get_stats().spec_decoding
        llm.shutdown()
    assert results[0] == results[1]
    assert spec_stats.num_draft_tokens > 0


def test_data_parallel_stats_add_up_the_spec_counters():
    from minivllm.core.stats import SchedulerStats
    from minivllm.engine.core_client import merge_stats

    one = SchedulerStats(
        num_blocks=8, spec_decoding=True, spec_num_drafts=2, spec_num_draft_tokens=6, spec_num_accepted_tokens=4
    )
    two = SchedulerStats(
        num_blocks=8, spec_decoding=True, spec_num_drafts=1, spec_num_draft_tokens=3, spec_num_accepted_tokens=1
    )
    total = merge_stats([one, two])
    assert total.spec_decoding
    assert (total.spec_num_drafts, total.spec_num_draft_tokens, total.spec_num_accepted_tokens) == (3, 9, 5)
