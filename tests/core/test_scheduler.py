"""The scheduler: one step's batch (prefill and decode together, chunks, seats, preemption),
and after the step the stop rules (``check_stop`` decides and changes nothing; the update
loop applies its decision, on its one-token path exactly where the rules say)."""

import copy

import pytest

from minivllm.core.scheduler import check_stop, stop_reason
from minivllm.outputs import ModelRunnerOutput
from minivllm.request import Request, RequestId, RequestStatus
from minivllm.sampling_params import SamplingParams
from tests.core.scheduler_helpers import base_config
from tests.core.scheduler_helpers import make_request as _make
from tests.core.scheduler_helpers import make_scheduler as _make_scheduler

EOS = 2
STOPPED, LENGTH = RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH


@pytest.fixture(scope="module")
def base():
    return base_config()


def make_request(req_id: str, num_prompt_tokens: int, max_tokens: int = 16, **params):
    request = _make(list(range(10, 10 + num_prompt_tokens)), max_tokens=max_tokens, req_id=req_id)
    request.sampling_params = SamplingParams(temperature=0.0, max_tokens=max_tokens, **params)
    request.eos_token_id = 2
    return request


def make_scheduler(base, num_blocks: int, **fields):
    """Small defaults (block size 4, 8 seqs, 64-token budget) and no prefix caching,
    so block ids are exactly those of plain allocation."""
    defaults = dict(block_size=4, max_num_seqs=8, max_num_batched_tokens=64, enable_prefix_caching=False)
    return _make_scheduler(base, num_blocks, **{**defaults, **fields})


def _sample(sched, out, token=7):
    """Pretend the model sampled ``token`` for every request that completed its known tokens."""
    sampled = {}
    for req_id in out.num_scheduled_tokens:
        req = sched.requests.get(req_id)
        if req is not None and req.num_computed_tokens == req.num_tokens:
            sampled[req_id] = [token]
    return sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))


def test_prefill_then_decode_share_one_batch(base):
    sched = make_scheduler(base, 16)
    sched.add_request(make_request("a", 6))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 6}
    assert [n.block_ids for n in out.new_reqs] == [[0, 1]]
    _sample(sched, out)
    sched.add_request(make_request("b", 5))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 1, "b": 5}  # a's decode token, then b's prefill
    assert out.cached_reqs.req_ids == ["a"]
    assert out.cached_reqs.num_computed_tokens == [6]
    assert out.cached_reqs.new_block_ids == [None]  # 7 tokens fit a's two blocks of 4
    assert out.new_reqs[0].block_ids == [2, 3]


def test_token_budget_chunks_a_long_prompt(base):
    sched = make_scheduler(base, 16, max_num_batched_tokens=4)
    sched.add_request(make_request("a", 10))
    chunks = []
    for _ in range(3):
        out = sched.schedule()
        chunks.append(out.num_scheduled_tokens["a"])
        result = _sample(sched, out)
    assert chunks == [4, 4, 2]
    assert [r.new_token_ids for r in result] == [[7]]  # only the last chunk samples


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget(base):
    sched = make_scheduler(base, 16, max_num_batched_tokens=8, enable_chunked_prefill=False)
    sched.add_request(make_request("a", 6))
    sched.add_request(make_request("b", 6))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 6}


def test_max_num_seqs_caps_running_requests(base):
    sched = make_scheduler(base, 32, max_num_seqs=2)
    for name in "abc":
        sched.add_request(make_request(name, 3))
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == ["a", "b"]
    assert [r.request_id for r in sched.waiting] == ["c"]


def test_preemption_takes_the_last_admitted_and_readmits_it_first(base):
    sched = make_scheduler(base, 4, block_size=4)
    sched.add_request(make_request("a", 8, max_tokens=8))
    sched.add_request(make_request("b", 8, max_tokens=8))
    out = sched.schedule()
    assert [n.block_ids for n in out.new_reqs] == [[0, 1], [2, 3]]
    _sample(sched, out)  # both now need a third block; none is free
    sched.add_request(make_request("c", 2))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 1}
    assert out.cached_reqs.new_block_ids == [[3]]  # b's blocks were freed tail first: 3 then 2
    assert sched.requests["b"].status == RequestStatus.PREEMPTED
    assert sched.requests["b"].num_computed_tokens == 0
    assert [r.request_id for r in sched.waiting] == ["b", "c"]  # b before the newer c
    assert "b" in out.forget_req_ids
    assert sched.num_preemptions == 1


def test_finish_on_eos_stop_token_and_length_frees_blocks(base):
    sched = make_scheduler(base, 8)
    sched.add_request(make_request("eos", 3, max_tokens=5))
    sched.add_request(make_request("stop", 3, max_tokens=5, stop_token_ids=[9]))
    sched.add_request(make_request("len", 3, max_tokens=1))
    out = sched.schedule()
    results = sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids={"eos": [2], "stop": [9], "len": [5]}))
    reasons = {r.req_id: (r.finish_reason, r.stop_reason) for r in results}
    assert reasons == {"eos": ("stop", None), "stop": ("stop", 9), "len": ("length", None)}
    assert sched.kv.num_free_blocks == 8
    assert not sched.has_unfinished_requests()


def test_min_tokens_and_ignore_eos_keep_generating(base):
    sched = make_scheduler(base, 8)
    sched.add_request(make_request("min", 3, max_tokens=5, min_tokens=2))
    sched.add_request(make_request("ign", 3, max_tokens=5, ignore_eos=True))
    out = sched.schedule()
    results = sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids={"min": [2], "ign": [2]}))
    assert all(r.finish_reason is None for r in results)


def test_abort_frees_blocks_and_tells_workers(base):
    sched = make_scheduler(base, 8)
    sched.add_request(make_request("a", 5))
    sched.schedule()
    sched.abort_requests(["a"])
    assert sched.kv.num_free_blocks == 8
    assert "a" in sched.schedule().forget_req_ids


def test_a_late_token_of_an_aborted_request_skips_a_new_request_with_its_id(base):
    """Under async scheduling or micro-batching a step may come back after its request
    was aborted and a new one took the same id: the old step's token is not the new one's."""
    sched = make_scheduler(base, 8)
    sched.add_request(make_request("a", 5))
    in_flight = sched.schedule()
    sched.abort_requests(["a"])
    newer = make_request("a", 3)
    sched.add_request(newer)
    outputs = sched.update_from_output(in_flight, ModelRunnerOutput(sampled_token_ids={"a": [7]}))
    assert outputs == [] and newer.output_token_ids == [] and sched.num_generated_tokens == 0
    out = sched.schedule()  # the new request runs normally
    assert out.num_scheduled_tokens == {"a": 3}
    assert [o.new_token_ids for o in _sample(sched, out, token=9)] == [[9]]


# ---- the stop rules ------------------------------------------------------------------


def _running_after(outputs: list[int], max_tokens: int = 5, **params) -> Request:
    """A running request whose newest output token is ``outputs[-1]``."""
    sampling = SamplingParams(temperature=0, max_tokens=max_tokens, **params)
    request = Request(RequestId("a"), [7, 8], sampling, eos_token_id=EOS, max_tokens=max_tokens)
    request.output_token_ids.extend(outputs)
    request.status = RequestStatus.RUNNING
    return request


@pytest.mark.parametrize(
    "outputs, params, status, reason",
    [
        ([5, 6], {}, None, None),
        ([5, EOS], {}, STOPPED, None),
        ([5, EOS], {"ignore_eos": True}, None, None),
        ([5, 9], {"stop_token_ids": [9]}, STOPPED, 9),
        ([EOS], {"min_tokens": 2}, None, None),
        ([5, 9], {"min_tokens": 2, "stop_token_ids": [9]}, STOPPED, 9),
        ([EOS], {"min_tokens": 2, "stop_token_ids": [EOS]}, None, None),
        ([3, 4, 5, 6, 7], {}, LENGTH, None),
        ([3, 4, 5, 6, EOS], {}, STOPPED, None),  # the stop wins over the length
        ([3, 4, 5, 6, 9], {"min_tokens": 5, "stop_token_ids": [9]}, STOPPED, 9),
    ],
)
def test_check_stop_decides_without_side_effects(outputs, params, status, reason):
    request = _running_after(outputs, **params)
    before = copy.deepcopy(vars(request))
    assert check_stop(request, outputs[-1]) is status
    assert vars(request) == before
    if status is STOPPED:
        assert stop_reason(request, outputs[-1]) == reason


def expected_stop(tokens, max_tokens, min_tokens=0, ignore_eos=False, stop_token_ids=()):
    """The stop rules, written out: (tokens kept, finish reason, stop reason)."""
    for i, token in enumerate(tokens):
        n = i + 1
        if n >= min_tokens and ((token == EOS and not ignore_eos) or token in stop_token_ids):
            return tokens[:n], "stop", None if token == EOS and not ignore_eos else token
        if n >= max_tokens:
            return tokens[:n], "length", None
    return tokens, None, None


@pytest.mark.parametrize(
    "tokens, params",
    [
        ([5, 6, EOS, 7], {}),
        ([5, EOS, 7, 8, 9], {"ignore_eos": True}),
        ([5, 9, 7], {"stop_token_ids": [9]}),
        ([EOS, 9, 5, EOS, 6], {"min_tokens": 3, "stop_token_ids": [9]}),
        ([5, 6, 7, 8, 9, 10], {}),
        ([5, 6, 7, 8, 9, 10], {"max_tokens": 3, "stop_token_ids": [7]}),
    ],
)
def test_one_token_steps_stop_where_the_rules_say(base, tokens, params):
    max_tokens = params.pop("max_tokens", 5)
    sched = _make_scheduler(base, 16, block_size=4, enable_prefix_caching=False)
    request = _make([11, 12, 13], max_tokens=max_tokens)
    request.sampling_params = SamplingParams(temperature=0, max_tokens=max_tokens, **params)
    request.eos_token_id = EOS
    sched.add_request(request)
    reported, reasons = [], []
    for token in tokens:
        if request.is_finished:
            break
        out = sched.schedule()
        (result,) = sched.update_from_output(out, ModelRunnerOutput({request.request_id: [token]}))
        reported += result.new_token_ids
        reasons.append(result.finish_reason)
    kept, finish_reason, stop_reason = expected_stop(tokens, max_tokens, **params)
    assert reported == request.output_token_ids == kept
    assert request.status.finish_reason == finish_reason
    assert reasons == [None] * (len(kept) - 1) + [finish_reason]
    assert request.stop_reason == stop_reason
