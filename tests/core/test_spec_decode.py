"""The scheduler's side: drafts get KV slots, and rejected drafts are rolled back
(num_computed_tokens and blocks), with exact values."""

from __future__ import annotations

import pytest

from minivllm.config.speculative import SpeculativeConfig
from minivllm.config.store import build_config
from minivllm.core.scheduler import Scheduler
from minivllm.core.spec_decode import SpecDecodeScheduling
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.outputs import ModelRunnerOutput
from minivllm.request import Request, RequestId
from minivllm.sampling_params import SamplingParams

PROMPT = [5, 6, 7, 8, 5, 6, 7]  # after a sampled 8, the suffix "6 7 8" occurred before, followed by "5 6 7"


@pytest.fixture(scope="module")
def cfg():
    return build_config(
        [
            "model=opt-125m",
            "load.format=dummy",
            "cache.block_size=4",
            "cache.enable_prefix_caching=false",
            "speculative=ngram",
            "speculative.prompt_lookup_min=2",
            "speculative.prompt_lookup_max=3",
            "speculative.num_speculative_tokens=3",
        ]
    )


def _request(max_tokens: int = 16) -> Request:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return Request(RequestId("a"), list(PROMPT), params, eos_token_id=None, max_tokens=max_tokens)


def _prefilled(cfg) -> tuple[Scheduler, Request]:
    """A scheduler over 8 blocks whose request finished its prompt and sampled 8."""
    scheduler = Scheduler(cfg, KVCacheSpec(cfg.cache.block_size, num_blocks=8))
    request = _request()
    scheduler.add_request(request)
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"a": 7} and not out.scheduled_spec_decode_tokens
    scheduler.update_from_output(out, ModelRunnerOutput(sampled_token_ids={"a": [8]}))
    return scheduler, request


def _verify_step(scheduler: Scheduler, emitted: list[int]):
    out = scheduler.schedule()
    assert out.scheduled_spec_decode_tokens == {"a": [5, 6, 7]}
    assert out.num_scheduled_tokens == {"a": 4}  # the last known token and three drafts
    assert out.cached_reqs.new_block_ids == [[2]]  # tokens 7..10 need a third block
    assert scheduler.kv.block_ids("a") == [0, 1, 2]
    scheduler.update_from_output(out, ModelRunnerOutput(sampled_token_ids={"a": emitted}))
    return out


def test_all_drafts_rejected_gives_back_the_draft_block(cfg):
    scheduler, request = _prefilled(cfg)
    _verify_step(scheduler, emitted=[9])
    assert request.output_token_ids == [8, 9]
    assert request.num_computed_tokens == 8  # the prompt and the 8; the 9 has no KV yet
    assert scheduler.kv.block_ids("a") == [0, 1]
    assert scheduler.kv.num_free_blocks == 6
    assert scheduler.spec.stats.num_draft_tokens == 3 and scheduler.spec.stats.num_accepted_tokens == 0


def test_the_next_step_after_a_rollback_gets_a_block_again(cfg):
    """The scheduler skips the KV-cache manager when a request's table already holds
    its next tokens; a rollback shrinks the table, so that shortcut must see it."""
    scheduler, request = _prefilled(cfg)
    _verify_step(scheduler, emitted=[9])  # table back to 2 blocks = 8 slots, all computed
    assert not scheduler.kv.has_room(request, 1)
    out = scheduler.schedule()
    needed = request.num_computed_tokens  # after schedule(): computed + scheduled
    assert len(scheduler.kv.block_ids("a")) * 4 >= needed
    assert out.cached_reqs.new_block_ids[0]  # the 9's slot is in a new block


def test_partial_acceptance_keeps_exactly_the_accepted_tokens(cfg):
    scheduler, request = _prefilled(cfg)
    _verify_step(scheduler, emitted=[5, 6, 9])  # two drafts accepted, then the target's 9
    assert request.output_token_ids == [8, 5, 6, 9]
    assert request.num_computed_tokens == 10
    assert scheduler.kv.block_ids("a") == [0, 1, 2]
    assert scheduler.kv.num_free_blocks == 5
    out = scheduler.schedule()  # the next step starts at the first token without KV
    assert out.cached_reqs.num_computed_tokens == [10]
    assert out.num_scheduled_tokens["a"] == 1 + len(out.scheduled_spec_decode_tokens.get("a", []))
    stats = scheduler.spec.stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 2)
    assert stats.mean_accepted_length == 3.0


def test_all_accepted_plus_the_bonus_token(cfg):
    scheduler, request = _prefilled(cfg)
    _verify_step(scheduler, emitted=[5, 6, 7, 1])
    assert request.num_computed_tokens == 11
    assert request.num_tokens == 12
    assert scheduler.kv.block_ids("a") == [0, 1, 2]


def test_drafts_never_pass_max_tokens(cfg):
    scheduler = Scheduler(cfg, KVCacheSpec(cfg.cache.block_size, num_blocks=8))
    request = Request(
        RequestId("a"),
        list(PROMPT),
        SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
        eos_token_id=None,
        max_tokens=3,
    )
    scheduler.add_request(request)
    scheduler.update_from_output(scheduler.schedule(), ModelRunnerOutput(sampled_token_ids={"a": [8]}))
    out = scheduler.schedule()
    assert out.scheduled_spec_decode_tokens == {"a": [5]}  # two outputs left: one draft and the target's own


def test_a_finished_request_frees_everything(cfg):
    scheduler, request = _prefilled(cfg)
    request.eos_token_id = 6
    request.sampling_params.ignore_eos = False
    _verify_step(scheduler, emitted=[5, 6, 9])  # stops at the accepted 6
    assert request.output_token_ids == [8, 5, 6]
    assert scheduler.kv.num_free_blocks == 8
    assert scheduler.spec.stats.num_accepted_tokens == 2


def _with_model_drafts(cfg, num_blocks: int) -> tuple[Scheduler, Request]:
    """A scheduler whose drafts come from the worker (a draft model), k = 3."""
    scheduler = Scheduler(cfg, KVCacheSpec(cfg.cache.block_size, num_blocks))
    spec = SpeculativeConfig(method="draft_model", model="draft", num_speculative_tokens=3)
    scheduler.spec = SpecDecodeScheduling(spec, max_model_len=64)
    request = _request()
    scheduler.add_request(request)
    return scheduler, request


def test_a_draft_model_gets_lookahead_slots_and_its_drafts_back(cfg):
    scheduler, request = _with_model_drafts(cfg, num_blocks=8)
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"a": 7}
    assert scheduler.kv.block_ids("a") == [0, 1]  # an admitted prompt gets no lookahead
    scheduler.update_from_output(out, ModelRunnerOutput(sampled_token_ids={"a": [8]}, spec_token_ids={"a": [5, 6, 7]}))
    out = scheduler.schedule()
    assert out.scheduled_spec_decode_tokens == {"a": [5, 6, 7]}  # the worker's proposals
    assert out.num_scheduled_tokens == {"a": 4}
    assert out.cached_reqs.new_block_ids == [[2, 3]]  # positions 7..10 scheduled, 11..13 lookahead
    scheduler.update_from_output(out, ModelRunnerOutput(sampled_token_ids={"a": [5, 9]}, spec_token_ids={}))
    assert request.num_computed_tokens == 9
    assert scheduler.kv.block_ids("a") == [0, 1, 2]
    assert scheduler.kv.num_free_blocks == 5
    assert not scheduler.schedule().scheduled_spec_decode_tokens  # the last output proposed nothing


def test_lookahead_slots_go_before_drafts_and_never_preempt(cfg):
    scheduler, request = _with_model_drafts(cfg, num_blocks=3)
    out = scheduler.schedule()
    scheduler.update_from_output(out, ModelRunnerOutput(sampled_token_ids={"a": [8]}, spec_token_ids={"a": [5, 6, 7]}))
    out = scheduler.schedule()
    assert out.scheduled_spec_decode_tokens == {"a": [5, 6, 7]}  # positions 7..10 fit in three blocks
    assert scheduler.kv.block_ids("a") == [0, 1, 2]  # the lookahead (11..13) would need a fourth
    assert scheduler.num_preemptions == 0
