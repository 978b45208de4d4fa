"""KVCacheSpec: what the workers report about the KV cache, merged over ranks and replicas."""

from __future__ import annotations

import pytest

from minivllm.kv_cache_spec import KVCacheSpec, max_blocks_per_request


def test_merge_keeps_the_fewest_blocks_and_a_window_only_when_every_rank_has_one():
    a, b = KVCacheSpec(16, 100, 256), KVCacheSpec(16, 90, 512)
    assert KVCacheSpec.merge([a, b]) == KVCacheSpec(16, 90, 512)  # the widest window, the fewest blocks
    # a pipeline stage holding a global-attention layer keeps every block of every stage
    assert KVCacheSpec.merge([a, KVCacheSpec(16, 120, None)]) == KVCacheSpec(16, 100, None)


def test_merge_refuses_ranks_with_other_block_sizes():
    with pytest.raises(ValueError, match=r"cache.block_size: \[8, 16\]"):
        KVCacheSpec.merge([KVCacheSpec(16, 10), KVCacheSpec(8, 10)])


def test_blocks_a_request_holds_follow_the_window():
    assert KVCacheSpec(16, 1000).num_tokens == 16_000
    assert KVCacheSpec(16, 1000).max_blocks_per_request(4096, 512) == 256
    assert KVCacheSpec(16, 1000, 256).max_blocks_per_request(4096, 512) == 49  # cdiv(255 + 512, 16) + 1
    assert KVCacheSpec(16, 1000, 256).max_blocks_per_request(100, 512) == 7  # a short request: all its blocks


def test_blocks_per_request_for_the_logged_concurrency():
    assert max_blocks_per_request(4096, 16, None, 512) == 256
    assert max_blocks_per_request(4096, 16, 256, 512) == 49  # cdiv(255 + 512, 16) + 1


def test_merge_keeps_the_bytes_per_block_of_a_rank():
    """What a KV connector moves per block on each rank: the ranks agree; the largest is kept."""
    merged = KVCacheSpec.merge([KVCacheSpec(16, 100, None, 4096), KVCacheSpec(16, 90, None, 4096)])
    assert merged == KVCacheSpec(16, 90, None, 4096)


def test_merge_keeps_the_fewest_state_slots_and_the_largest_slot():
    """Hybrid models: every rank allocates max_num_seqs slots; the plan takes the fewest."""
    a = KVCacheSpec(16, 100, None, 4096, num_state_slots=8, state_slot_bytes=5376)
    b = KVCacheSpec(16, 90, None, 4096, num_state_slots=6, state_slot_bytes=2688)
    merged = KVCacheSpec.merge([a, b])
    assert (merged.num_blocks, merged.num_state_slots, merged.state_slot_bytes) == (90, 6, 5376)
    assert merged.state_bytes == 6 * 5376
    assert KVCacheSpec.merge([KVCacheSpec(16, 10), KVCacheSpec(16, 12)]).num_state_slots == 0
