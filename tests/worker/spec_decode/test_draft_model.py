"""method=draft_model end to end: greedy outputs equal the engine without speculation
(preemption forced, prefix caching on, block tables checked each step), a draft that
is the target itself has every draft accepted (its KV over the shared blocks is exact),
a 2-layer cut of the demo model reports its mean accepted length, seeded sampling is
reproducible, and bad drafts are clear config errors."""

from __future__ import annotations

import json
import shutil

import pytest

from minivllm.config.store import ASSETS_DIR, build_config
from minivllm.sampling_params import SamplingParams
from tests.worker.spec_decode.test_engine import PROMPTS, check_block_tables_each_step, greedy_params, make_engine, run
from tools.cut_draft_model import cut_layers


@pytest.fixture(scope="module")
def demo_draft(tmp_path_factory):
    return cut_layers(ASSETS_DIR / "demo-llama", tmp_path_factory.mktemp("demo-draft"), 2)


def draft_keys(path, k: int = 3) -> dict:
    return {
        "speculative.method": "draft_model",
        "speculative.model": str(path),
        "speculative.num_speculative_tokens": k,
    }


def test_greedy_equals_no_speculation_on_the_demo_model_with_preemption(demo_draft):
    plain = run(make_engine(["model=demo"], spec=False, num_blocks=24), greedy_params())
    engine = make_engine(["model=demo"], spec=False, num_blocks=24, **draft_keys(demo_draft))
    steps = check_block_tables_each_step(engine)
    assert run(engine, greedy_params()) == plain
    sched = engine.core.scheduler.stats()
    assert steps and sched.num_preemptions > 0 and sched.prefix_cache_hits > 0
    stats = engine.get_stats()
    spec = stats.spec_decoding
    assert spec.num_draft_tokens > 0 and spec.mean_accepted_length > 1.0
    assert f"Mean accepted length: {spec.mean_accepted_length:.2f}" in stats.format()


@pytest.mark.parametrize("name", ["llama_dir", "opt_dir"])
def test_the_target_as_its_own_draft_has_every_draft_accepted(name, request):
    """The draft's KV lives in the target's blocks (prefix-cache hits, preemptions, rollbacks):
    if any of it were stale, the draft would disagree with the target somewhere. Its bytes
    per block are counted beside the target's."""
    path = request.getfixturevalue(name)
    plain_engine = make_engine([f"model.path={path}"], spec=False, num_blocks=24)
    plain = run(plain_engine, greedy_params())
    engine = make_engine([f"model.path={path}"], spec=False, num_blocks=24, **draft_keys(path))
    assert run(engine, greedy_params()) == plain
    stats = engine.core.scheduler.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert stats.spec_num_draft_tokens > 50
    assert stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens
    runner, plain_runner = (e.core.executor.worker.model_runner for e in (engine, plain_engine))
    assert runner.kv_cache_bytes_per_block() == 2 * plain_runner.kv_cache_bytes_per_block()


def test_seeded_sampling_with_a_draft_model_is_reproducible(llama_dir):
    params = [
        SamplingParams(temperature=0.8, top_k=30, seed=11 + i, max_tokens=16, ignore_eos=True)
        for i in range(len(PROMPTS))
    ]
    keys = draft_keys(llama_dir)
    first = run(make_engine([f"model.path={llama_dir}"], spec=False, num_blocks=24, **keys), params)
    engine = make_engine([f"model.path={llama_dir}"], spec=False, num_blocks=24, **keys)  # with preemptions
    assert run(engine, params) == first
    stats = engine.core.scheduler.stats()
    assert stats.num_preemptions > 0
    # the draft is the target: with q = p every draft is accepted (min(1, p / q) = 1)
    assert stats.spec_num_accepted_tokens >= 0.9 * stats.spec_num_draft_tokens > 0


def test_bad_draft_models_are_clear_config_errors(llama_dir, demo_draft, tmp_path):
    demo = ["model=demo"]
    with pytest.raises(ValueError, match="draft_tensor_parallel_size=2: only 1"):
        build_config(
            [
                *demo,
                "speculative.method=draft_model",
                f"speculative.model={demo_draft}",
                "speculative.draft_tensor_parallel_size=2",
            ]
        )
    with pytest.raises(ValueError, match="speculative.model: is required with speculative.method=draft_model"):
        build_config([*demo, "speculative.method=draft_model"])
    with pytest.raises(ValueError, match="vocab_size .* differs from the target's"):
        build_config([*demo, "model.max_model_len=256", f"speculative.model={llama_dir}"])  # method inferred
    with pytest.raises(ValueError, match=r"speculative.model=.*max_model_len=512: larger than the model's"):
        build_config([*demo, f"speculative.model={llama_dir}"])  # the draft's context is shorter
    other = shutil.copytree(demo_draft, tmp_path / "other-tokenizer")
    data = json.loads((other / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = list(vocab)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="tokenizer.json maps tokens to other ids"):
        build_config([*demo, "speculative.method=draft_model", f"speculative.model={other}"])
    with pytest.raises(ValueError, match="speculative.model=.*only used by speculative.method=draft_model"):
        build_config([*demo, "speculative.method=ngram", f"speculative.model={demo_draft}"])
    with pytest.raises(ValueError, match="parallel.tp=2 is not supported"):
        build_config(
            [
                f"model.path={llama_dir}",
                "speculative.method=draft_model",
                f"speculative.model={llama_dir}",
                "parallel.tp=2",
            ]
        )
