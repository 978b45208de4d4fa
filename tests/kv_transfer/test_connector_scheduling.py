"""The connector's scheduler half in the real scheduler, with exact blocks and host slots
(no model: the steps' outputs are made up, as in tests/core)."""

from __future__ import annotations

from minivllm.config.store import build_config
from minivllm.core.scheduler import Scheduler
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.outputs import ModelRunnerOutput
from tests.core.scheduler_helpers import make_request

BYTES = 200
"""KV bytes of one block on a rank (made up: the scheduler only divides by it)."""


def _scheduler(num_blocks: int, num_slots: int) -> Scheduler:
    cfg = build_config(
        [
            "model=opt-125m",
            "load.format=dummy",
            "cache.block_size=4",
            f"cache.kv_offloading_size={num_slots * BYTES / 2**30}",
        ]
    )
    return Scheduler(cfg, KVCacheSpec(4, num_blocks, None, BYTES))


def _run(scheduler: Scheduler, tokens: list[int]):
    """Admit one request (one output token), run its step; the step's connector metadata."""
    request = make_request(tokens, max_tokens=1)
    scheduler.add_request(request)
    out = scheduler.schedule()
    table = scheduler.kv.block_ids(request.request_id)
    scheduler.update_from_output(out, ModelRunnerOutput(sampled_token_ids={request.request_id: [7]}))
    return request, out, table


def test_full_blocks_are_saved_after_their_step_and_loaded_after_eviction():
    scheduler = _scheduler(num_blocks=4, num_slots=6)
    first, out, table = _run(scheduler, list(range(13)))
    meta = out.kv_connector_metadata
    assert meta.loads == {} and meta.saves == {first.request_id: [(table[0], 0), (table[1], 1), (table[2], 2)]}
    second, out, _ = _run(scheduler, list(range(100, 113)))  # takes every device block: the first's are evicted
    assert [slot for _, slot in out.kv_connector_metadata.saves[second.request_id]] == [3, 4, 5]
    again, out, table = _run(scheduler, list(range(13)))
    meta = out.kv_connector_metadata
    assert meta.loads == {again.request_id: [(table[0], 0), (table[1], 1), (table[2], 2)]}
    assert meta.saves == {}  # its blocks are in the host pool already
    assert out.num_scheduled_tokens == {again.request_id: 1}  # 12 tokens loaded, the last one computed
    assert again.num_cached_tokens == 12
    stats = scheduler.stats()
    assert (stats.prefix_cache_hits, stats.external_prefix_cache_hits) == (0, 12)


def test_the_least_recently_used_slot_is_reused_first():
    scheduler = _scheduler(num_blocks=4, num_slots=3)
    _run(scheduler, list(range(13)))  # slots 0, 1, 2
    second, out, _ = _run(scheduler, list(range(100, 113)))
    assert [slot for _, slot in out.kv_connector_metadata.saves[second.request_id]] == [0, 1, 2]
    again, out, _ = _run(scheduler, list(range(13)))  # the first's copies were overwritten
    assert out.kv_connector_metadata.loads == {} and again.num_cached_tokens == 0


def test_nothing_to_move_is_no_metadata():
    scheduler = _scheduler(num_blocks=8, num_slots=3)
    _, out, _ = _run(scheduler, [1, 2, 3])  # no full block
    assert out.kv_connector_metadata is None
    plain = Scheduler(build_config(["model=opt-125m", "load.format=dummy"]), KVCacheSpec(16, 8))
    assert plain.connector is None
