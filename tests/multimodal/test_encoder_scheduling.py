"""Encoder scheduling with hand-made requests: which images are encoded in which step,
when a chunk stops before an image, and when cache entries are freed."""

from __future__ import annotations

from minivllm.multimodal.feature import MultiModalFeature
from minivllm.request import RequestId
from tests.core.scheduler_helpers import FakeRunner, base_config, make_request, make_scheduler, step

IMG = 99


def _request(req_id: str, length: int, images: list[tuple[int, int]], names: list[str] | None = None):
    """``images``: (offset, length) each; ``names``: their identifiers (default: unique per request)."""
    tokens = list(range(1, length + 1))
    features = []
    for i, (offset, n) in enumerate(images):
        tokens[offset : offset + n] = [IMG] * n
        features.append(MultiModalFeature(names[i] if names else f"{req_id}-img{i}", "image", offset, n))
    request = make_request(tokens, max_tokens=2, req_id=req_id)
    request.mm_features = features
    return request


def _scheduler(budget: int, encoder_budget: int, cache: int):
    return make_scheduler(
        base_config(),
        256,
        max_num_batched_tokens=budget,
        max_num_encoder_input_tokens=encoder_budget,
        encoder_cache_size=cache,
        enable_prefix_caching=False,
    )


def test_images_encoded_in_the_step_that_reaches_them_and_freed_after():
    sched = _scheduler(budget=8, encoder_budget=8, cache=8)
    runner = FakeRunner(sched.kv.block_size)
    a = RequestId("a")
    sched.add_request(_request("a", 20, [(2, 6), (12, 6)]))
    s1 = step(sched, runner)  # tokens 0..7 reach image 0 (2..7)
    assert s1.scheduled_encoder_inputs == {a: [0]} and s1.num_scheduled_tokens[a] == 8
    s2 = step(sched, runner)  # tokens 8..15 reach image 1 (12..17); image 0 is all computed
    assert s2.free_encoder_input_ids == ["a-img0"]
    assert s2.scheduled_encoder_inputs == {a: [1]}
    s3 = step(sched, runner)  # tokens 16..19: image 1's tail, from the cache
    assert s3.scheduled_encoder_inputs == {} and s3.free_encoder_input_ids == []
    s4 = step(sched, runner)  # a decode step; image 1 was freed after step 3
    assert s4.free_encoder_input_ids == ["a-img1"] and s4.scheduled_encoder_inputs == {}
    assert sched.encoder.num_free == 8 and not sched.encoder.cached


def test_chunk_stops_before_an_image_the_cache_cannot_hold():
    sched = _scheduler(budget=16, encoder_budget=8, cache=8)
    runner = FakeRunner(sched.kv.block_size)
    b, c = RequestId("b"), RequestId("c")
    sched.add_request(_request("b", 10, [(0, 6)]))
    sched.add_request(_request("c", 10, [(4, 6)]))
    s1 = step(sched, runner)
    assert s1.scheduled_encoder_inputs == {b: [0]}
    assert s1.num_scheduled_tokens == {b: 10, c: 4}  # c stops just before its image (2 cache tokens free)
    s2 = step(sched, runner)
    assert s2.free_encoder_input_ids == ["b-img0"]
    assert s2.scheduled_encoder_inputs == {c: [0]} and s2.num_scheduled_tokens[c] == 6


def test_nothing_scheduled_when_the_chunk_starts_inside_an_unencodable_image():
    sched = _scheduler(budget=16, encoder_budget=6, cache=6)
    runner = FakeRunner(sched.kv.block_size)
    d, e = RequestId("d"), RequestId("e")
    sched.add_request(_request("d", 8, [(0, 6)]))
    sched.add_request(_request("e", 8, [(0, 6)]))
    s1 = step(sched, runner)
    assert s1.num_scheduled_tokens == {d: 8}  # e's first token is a placeholder: it waits
    s2 = step(sched, runner)
    assert s2.scheduled_encoder_inputs == {e: [0]} and s2.num_scheduled_tokens[e] == 8


def test_abort_and_preemption_free_the_entries():
    sched = _scheduler(budget=4, encoder_budget=8, cache=8)
    runner = FakeRunner(sched.kv.block_size)
    f = RequestId("f")
    sched.add_request(_request("f", 12, [(2, 6)]))
    s1 = step(sched, runner)  # tokens 0..3 reach the image: encoded, not all computed
    assert s1.scheduled_encoder_inputs == {f: [0]} and sched.encoder.num_free == 2
    sched.abort_requests([f])
    assert sched.encoder.num_free == 8
    sched.add_request(_request("g", 12, [(2, 6)]))
    s2 = sched.schedule()
    assert "f-img0" in s2.free_encoder_input_ids and f in s2.forget_req_ids
    victim = sched.running[0]
    sched._preempt(victim)  # the KV cache ran out: its encoder output goes too
    assert sched.encoder.num_free == 8 and not sched.encoder.cached
    assert "g-img0" in sched.encoder.take_freed()


def test_requests_with_the_same_image_share_one_encoder_output():
    """Two requests holding image X: encoded once, kept while either still needs it."""
    sched = _scheduler(budget=8, encoder_budget=8, cache=8)
    runner = FakeRunner(sched.kv.block_size)
    h, k = RequestId("h"), RequestId("k")
    sched.add_request(_request("h", 12, [(4, 6)], names=["X"]))
    sched.add_request(_request("k", 8, [(0, 6)], names=["X"]))
    s1 = step(sched, runner)  # h: tokens 0..7 reach X: encoded; no budget left for k
    assert s1.scheduled_encoder_inputs == {h: [0]} and s1.num_scheduled_tokens == {h: 8}
    s2 = step(sched, runner)  # h: 8..11 (done with X); k: 0..3 reaches X: the cached output
    assert s2.num_scheduled_tokens == {h: 4, k: 4}
    assert s2.scheduled_encoder_inputs == {} and s2.free_encoder_input_ids == []
    assert sched.encoder.users["X"] == {k}  # h let go of it; k holds it
    s3 = step(sched, runner)  # k: 4..7, the rest of X
    assert s3.scheduled_encoder_inputs == {} and s3.free_encoder_input_ids == []
    s4 = step(sched, runner)
    assert s4.free_encoder_input_ids == ["X"] and sched.encoder.num_free == 8
