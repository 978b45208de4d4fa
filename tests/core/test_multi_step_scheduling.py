"""Multi-step decoding in the scheduler (``scheduler.num_scheduler_steps``): which batches
run several decode steps, the KV slots they take ahead, how their tokens come back (up to
the first that stops a request), async scheduling's placeholders, and the configurations
refused by name. The fake runner checks every KV position a request reads or writes."""

import copy
import random

import pytest

from minivllm.config.store import build_config
from minivllm.core.scheduler import Scheduler
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.outputs import ModelRunnerOutput, PositionLogprobs
from minivllm.request import RequestStatus
from minivllm.sample.metadata import may_run_ahead, may_speculate
from minivllm.sampling_params import SamplingParams, StructuredOutputsParams
from tests.core.scheduler_helpers import (
    FakeRunner,
    base_config,
    expected_output,
    make_request,
    make_scheduler,
    run_to_completion,
    step,
)

BS = 4
EOS = 2


@pytest.fixture(scope="module")
def base():
    return base_config()


def steps_scheduler(base, num_blocks: int = 64, steps: int = 4, **fields):
    defaults = dict(block_size=BS, enable_prefix_caching=False, max_num_seqs=8, max_num_batched_tokens=64)
    return make_scheduler(base, num_blocks, num_scheduler_steps=steps, **{**defaults, **fields})


def test_a_decode_only_batch_runs_every_step_with_its_slots_taken_ahead(base):
    sched, runner = steps_scheduler(base), FakeRunner(BS)
    a, b = (
        make_request(range(10, 15), max_tokens=10, req_id="a"),
        make_request(range(20, 23), max_tokens=10, req_id="b"),
    )
    for r in (a, b):
        sched.add_request(r)
    assert step(sched, runner).num_steps == 1  # the prompts: a prefill runs once
    assert (a.num_computed_tokens, a.num_tokens) == (5, 6)
    out = sched.schedule()
    assert out.num_steps == 4 and out.num_scheduled_tokens == {"a": 1, "b": 1}
    # each request's table holds the 4 tokens the batch computes: a's positions 5..8, b's 3..6
    assert len(sched.kv.block_ids("a")) * BS >= 9 and len(sched.kv.block_ids("b")) * BS >= 7
    assert a.num_computed_tokens == 5 + 4 and b.num_computed_tokens == 3 + 4
    sched.update_from_output(out, runner.execute(out))
    assert a.output_token_ids == expected_output(a.prompt_token_ids, 5)  # 1 from the prefill + 4
    run_to_completion(sched, runner)
    for r in (a, b):
        assert r.output_token_ids == expected_output(r.prompt_token_ids, 10)
    assert sched.kv.num_free_blocks == 64


def test_tokens_past_a_stop_are_dropped_and_the_request_finishes(base):
    sched = steps_scheduler(base)
    a = make_request(range(10, 15), max_tokens=10, req_id="a")
    a.sampling_params = SamplingParams(temperature=0, max_tokens=10)
    a.eos_token_id = EOS
    sched.add_request(a)
    out = sched.schedule()
    sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids={"a": [7]}))
    out = sched.schedule()
    assert out.num_steps == 4
    positions = [PositionLogprobs({t: -0.5}, 1) for t in (8, EOS, 9, 9)]
    output = ModelRunnerOutput(sampled_token_ids={"a": [8, EOS, 9, 9]}, logprobs={"a": positions})
    results = sched.update_from_output(out, output)
    assert a.output_token_ids == [7, 8, EOS] and a.status is RequestStatus.FINISHED_STOPPED
    assert [r.new_token_ids for r in results] == [[8, EOS]] and results[0].finish_reason == "stop"
    assert results[0].new_logprobs == positions[:2]  # the dropped tokens' logprobs go with them
    assert sched.num_generated_tokens == 3
    assert sched.kv.num_free_blocks == 64 and not sched.has_unfinished_requests()


def test_the_steps_are_bounded_by_max_tokens_and_the_context_length(base):
    sched = steps_scheduler(base, steps=8)
    a, b = make_request([10, 11], max_tokens=3, req_id="a"), make_request([20, 21], max_tokens=4, req_id="b")
    for r in (a, b):
        sched.add_request(r)
    step(sched, FakeRunner(BS))
    assert sched.schedule().num_steps == 3  # b, the furthest from its max_tokens, needs 3 more
    cfg = copy.deepcopy(base)
    cfg.max_model_len, cfg.scheduler.num_scheduler_steps = 8, 8
    cfg.cache.block_size, cfg.cache.enable_prefix_caching = BS, False
    sched, runner = Scheduler(cfg, KVCacheSpec(BS, 64)), FakeRunner(BS)
    c, d = make_request(range(10, 14), max_tokens=4, req_id="c"), make_request([20, 21], max_tokens=6, req_id="d")
    for r in (c, d):  # max_tokens as the engine caps them: c's 4 prompt + 4 outputs fill max_model_len=8
        sched.add_request(r)
    step(sched, runner)
    out = step(sched, runner)
    assert out.num_steps == 3  # c's last 3 tokens; d, which wants 5, waits for the next batch
    assert c.num_tokens == 8 and c.status is RequestStatus.FINISHED_LENGTH
    run_to_completion(sched, runner)
    assert d.output_token_ids == expected_output(d.prompt_token_ids, 6)


@pytest.mark.parametrize(
    "params",
    [
        dict(repetition_penalty=1.3),
        dict(logit_bias={5: 1.0}),
        dict(min_tokens=3, stop_token_ids=[9]),
        dict(structured_outputs=StructuredOutputsParams(choice=["yes", "no"])),
    ],
    ids=["penalty", "logit-bias", "min-tokens", "grammar"],
)
def test_a_request_that_needs_the_host_between_steps_keeps_single_steps(base, params):
    sched = steps_scheduler(base)
    plain, other = make_request([10, 11, 12], max_tokens=8), make_request([20, 21, 22], max_tokens=8)
    other.sampling_params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, **params)
    other.sampling_params._all_stop_token_ids = set(other.sampling_params.stop_token_ids)  # as the processor sets them
    sched.add_request(plain)
    step(sched, FakeRunner(BS))
    assert sched.schedule().num_steps == 4  # alone, the plain request runs ahead
    sched = steps_scheduler(base)
    for r in (make_request([10, 11, 12], max_tokens=8), other):  # past add_request: no grammar backend here
        sched.requests[r.request_id] = r
        sched.waiting.append(r)
    step(sched, FakeRunner(BS))
    assert sched.schedule().num_steps == 1


def test_a_request_asking_for_logprobs_runs_ahead(base):
    """Logprobs read the distribution of the step's own logits, not the token history: a batch
    with such a request runs every step (speculative decoding drafts for none of them)."""
    sched = steps_scheduler(base)
    request = make_request([10, 11, 12], max_tokens=8)
    request.sampling_params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    sched.add_request(request)
    step(sched, FakeRunner(BS))
    assert sched.schedule().num_steps == 4
    assert may_run_ahead(request.sampling_params) and not may_speculate(request.sampling_params)


def test_a_waiting_request_or_a_prefill_chunk_keeps_single_steps(base):
    sched, runner = steps_scheduler(base, max_num_seqs=1), FakeRunner(BS)
    sched.add_request(make_request([10, 11, 12], max_tokens=6, req_id="a"))
    step(sched, runner)
    sched.add_request(make_request([20, 21], max_tokens=2, req_id="b"))  # no seat: it waits
    assert step(sched, runner).num_steps == 1
    sched, runner = steps_scheduler(base, max_num_batched_tokens=4), FakeRunner(BS)
    sched.add_request(make_request([10, 11], max_tokens=6, req_id="a"))
    step(sched, runner)
    sched.add_request(make_request(list(range(20, 30)), max_tokens=2, req_id="b"))
    assert step(sched, runner).num_scheduled_tokens == {"a": 1, "b": 3}  # b's first chunk
    assert step(sched, runner).num_steps == 1  # b's next chunk: one step for both
    assert sched.requests["b"].num_computed_tokens == 6


def test_without_room_for_every_step_the_batch_runs_fewer_and_preempts_no_one(base):
    # 3 blocks of 4: a and b hold 2 and 1 after their prompts; 4 steps would need 2 more blocks, 2 steps 1
    sched, runner = steps_scheduler(base, num_blocks=3), FakeRunner(BS)
    for r in (make_request(range(10, 17), max_tokens=8, req_id="a"), make_request([20, 21], max_tokens=8, req_id="b")):
        sched.add_request(r)
    step(sched, runner)
    out = step(sched, runner)
    assert out.num_steps == 1 and sched.num_preemptions == 0
    # 4 blocks: a (5 tokens) holds 2, b (4) 1; one free block takes b's slots for 2 steps, not both's for 4
    sched, runner = steps_scheduler(base, num_blocks=4), FakeRunner(BS)
    for r in (
        make_request(range(10, 15), max_tokens=8, req_id="a"),
        make_request(range(20, 24), max_tokens=8, req_id="b"),
    ):
        sched.add_request(r)
    step(sched, runner)
    out = step(sched, runner)
    assert out.num_steps == 2 and sched.num_preemptions == 0
    assert sched.kv.num_free_blocks == 0


def test_async_placeholders_count_every_step(base):
    sched = steps_scheduler(base, async_scheduling=True)
    sched.async_scheduling = True  # make_scheduler sets the field; the engine resolves it
    a = make_request([10, 11, 12], max_tokens=9, req_id="a")
    sched.add_request(a)
    first = sched.schedule()  # the prompt: one placeholder
    second = sched.schedule()  # scheduled before the first's token is known: its input is the placeholder
    assert (first.num_steps, second.num_steps) == (1, 4)
    assert a.num_output_placeholders == 5 and a.num_computed_tokens == 3 + 4
    third = sched.schedule()
    assert third.num_steps == 4 and a.num_output_placeholders == 9  # 9 tokens pending: max_tokens
    assert sched.schedule().is_empty  # nothing more it could need
    sched.update_from_output(first, ModelRunnerOutput(sampled_token_ids={"a": [5]}))
    sched.update_from_output(second, ModelRunnerOutput(sampled_token_ids={"a": [6, 7, 8, 9]}))
    assert a.num_output_placeholders == 4 and a.output_token_ids == [5, 6, 7, 8, 9]
    sched.update_from_output(third, ModelRunnerOutput(sampled_token_ids={"a": [10, 11, 12, 13]}))
    assert a.status is RequestStatus.FINISHED_LENGTH and a.output_token_ids == list(range(5, 14))


@pytest.mark.parametrize("caching", [True, False])
def test_many_requests_under_pressure_finish_with_unpressured_outputs(base, caching):
    """Preemption, prefix hits and chunked prompts between multi-step batches: every token
    as the fake model decodes it alone, every KV position read as written."""
    rng = random.Random(2)
    shared = [[rng.randrange(3, 500) for _ in range(rng.randrange(4, 12))] for _ in range(3)]
    prompts = [rng.choice(shared) + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 12))] for _ in range(24)]
    sched = steps_scheduler(
        base, num_blocks=20, steps=3, max_num_batched_tokens=16, max_num_seqs=6, enable_prefix_caching=caching
    )
    requests = [make_request(p, max_tokens=rng.randrange(1, 24)) for p in prompts]
    for r in requests:
        sched.add_request(r)
    outs = run_to_completion(sched, FakeRunner(BS))
    for r in requests:
        assert r.output_token_ids == expected_output(r.prompt_token_ids, r.max_tokens)
    assert sched.num_preemptions > 0 and any(o.num_steps > 1 for o in outs)
    assert sched.kv.num_free_blocks == 20 and sched.kv.num_shared_blocks() == 0


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["scheduler.num_scheduler_steps=0"], "scheduler.num_scheduler_steps"),
        (["speculative.method=ngram", "speculative.num_speculative_tokens=2"], "speculative.method=ngram"),
        (["parallel.pp=2"], "parallel.pp=2"),
        (["model.runner=pooling"], "model.runner=pooling"),
        (["cache.kv_offloading_size=1"], "kv_transfer.kv_connector=OffloadingConnector"),
    ],
)
def test_what_multi_step_cannot_serve_is_refused_by_name(overrides, named):
    with pytest.raises(ValueError, match="scheduler.num_scheduler_steps") as error:
        build_config(["model=opt-125m", "load.format=dummy", "scheduler.num_scheduler_steps=4", *overrides])
    assert named in str(error.value)
