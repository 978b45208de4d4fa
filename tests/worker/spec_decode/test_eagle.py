"""method=eagle: a random head drafts badly, but outputs equal the plain engine token for
token (preemption forced, prefix caching on); its drafts equal a transformers reference of
the head (so its KV, shifted inputs and hidden-state plumbing are exact); sampled drafts
carry their distributions to the verifier; bad heads are clear config errors."""

from __future__ import annotations

import pytest
import torch

from minivllm.config.store import ASSETS_DIR, build_config
from minivllm.sampling_params import SamplingParams
from tests.worker.spec_decode.eagle_heads import EagleReference
from tests.worker.spec_decode.test_engine import PROMPTS, check_block_tables_each_step, greedy_params, make_engine, run
from tools.make_eagle_head import make_eagle_head

DEMO = ASSETS_DIR / "demo-llama"


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    return make_eagle_head(DEMO, tmp_path_factory.mktemp("eagle-head"), seed=5)


def eagle_keys(path, k: int = 3) -> dict:
    return {"speculative.method": "eagle", "speculative.model": str(path), "speculative.num_speculative_tokens": k}


def record_proposals(engine) -> list:
    """(tokens, drafts, draft distributions) of every proposal the head makes."""
    drafter, seen = engine.core.executor.worker.model_runner.drafter, []
    propose = drafter.propose

    def recorded(batch, step, hidden):
        out = propose(batch, step, hidden)
        for req_id, drafts in out.items():
            seen.append((batch.tokens_of(batch.row_of[req_id]), drafts, drafter.draft_probs.get(req_id)))
        return out

    drafter.propose = recorded
    return seen


def test_greedy_equals_no_speculation_with_preemption_and_prefix_caching(head):
    plain = run(make_engine(["model=demo"], spec=False, num_blocks=28), greedy_params())
    engine = make_engine(["model=demo"], spec=False, num_blocks=28, **eagle_keys(head))
    steps = check_block_tables_each_step(engine)
    assert run(engine, greedy_params()) == plain
    stats = engine.core.scheduler.stats()
    assert steps and stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert stats.spec_num_draft_tokens > 0


def test_drafts_equal_a_transformers_reference_of_the_head(head):
    """Prefix caching off: a cached block's last head entry reads the first token of the next
    block, which may differ between the requests that share it (drafts only, never outputs)."""
    engine = make_engine(
        ["model=demo"], spec=False, num_blocks=64, **eagle_keys(head), **{"cache.enable_prefix_caching": "false"}
    )
    seen = record_proposals(engine)
    run(engine, [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True) for _ in PROMPTS])
    reference = EagleReference(DEMO, head)
    assert len(seen) > 10
    for tokens, drafts, _ in seen:
        assert drafts == reference.drafts(tokens, len(drafts)), tokens


def test_sampled_drafts_carry_their_distributions_and_seeds_reproduce(head):
    params = [
        SamplingParams(temperature=0.9, top_k=40, seed=3 + i, max_tokens=12, ignore_eos=True)
        for i in range(len(PROMPTS))
    ]
    outputs = []
    for _ in range(2):
        engine = make_engine(["model=demo"], spec=False, num_blocks=24, **eagle_keys(head))
        seen = record_proposals(engine)
        outputs.append(run(engine, params))
    assert outputs[0] == outputs[1]
    assert seen
    for _, drafts, q in seen:
        assert q is not None and q.shape[0] == len(drafts)
        assert torch.allclose(q.sum(dim=-1), torch.ones(len(drafts)), atol=1e-4)
        assert (q[torch.arange(len(drafts)), torch.tensor(drafts)] > 0).all()  # drawn from q
        assert ((q > 0).sum(dim=-1) <= 40).all()  # the request's top-k applies to the draft too


def test_bad_eagle_heads_are_clear_config_errors(head, llama_dir, opt_dir, tmp_path):
    with pytest.raises(ValueError, match="EAGLE heads are supported for LlamaForCausalLM targets, not OPT"):
        build_config([f"model.path={opt_dir}", "speculative.method=eagle", f"speculative.model={head}"])
    narrow = make_eagle_head(DEMO, tmp_path / "narrow", hidden_size=128, head_dim=32)
    with pytest.raises(ValueError, match="hidden_size 128 differs from the target's 256"):
        build_config(["model=demo", "speculative.method=eagle", f"speculative.model={narrow}"])
    with pytest.raises(ValueError, match="no fc.weight in its safetensors files"):
        build_config(["model=demo", "speculative.method=eagle", f"speculative.model={DEMO}"])
    with pytest.raises(ValueError, match="speculative.model: is required with speculative.method=eagle"):
        build_config(["model=demo", "speculative.method=eagle"])
