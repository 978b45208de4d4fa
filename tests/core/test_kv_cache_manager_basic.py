"""Block allocation without prefix caching: exact block ids, order and accounting."""

from minivllm.core.block_pool import BlockPool
from minivllm.core.kv_cache_manager import KVCacheManager
from tests.core.scheduler_helpers import make_request as _make


def make_request(req_id: str, num_prompt_tokens: int):
    return _make(list(range(10, 10 + num_prompt_tokens)), req_id=req_id)


def test_allocation_takes_blocks_from_the_front_in_order():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = make_request("a", 9)
    assert kv.allocate_slots(a, 9) == [0, 1, 2]
    b = make_request("b", 4)
    assert kv.allocate_slots(b, 4) == [3]
    assert kv.block_ids("a") == [0, 1, 2]
    assert kv.num_free_blocks == 4


def test_growing_within_the_last_block_needs_no_new_block():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    r = make_request("r", 5)
    assert kv.allocate_slots(r, 5) == [0, 1]
    r.num_computed_tokens = 5
    assert kv.allocate_slots(r, 3) == []  # 8 tokens still fit two blocks
    r.num_computed_tokens = 8
    assert kv.allocate_slots(r, 1) == [2]


def test_allocation_fails_without_side_effects_when_blocks_run_out():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    assert kv.allocate_slots(make_request("a", 8), 8) == [0, 1]
    b = make_request("b", 9)
    assert kv.allocate_slots(b, 9) is None
    assert kv.block_ids("b") == []
    assert kv.num_free_blocks == 1


def test_freed_blocks_return_tail_first_to_the_back_of_the_queue():
    kv = KVCacheManager(num_blocks=6, block_size=4)
    a = make_request("a", 12)
    kv.allocate_slots(a, 12)  # blocks 0, 1, 2
    kv.free(a)
    assert kv.pool.free_block_ids() == [3, 4, 5, 2, 1, 0]
    b = make_request("b", 16)
    assert kv.allocate_slots(b, 16) == [3, 4, 5, 2]


def test_usage_and_waste_under_one_block_per_request():
    kv = KVCacheManager(num_blocks=20, block_size=4)
    lengths = [1, 4, 5, 11, 16]
    for i, n in enumerate(lengths):
        kv.allocate_slots(make_request(str(i), n), n)
    used = sum(-(-n // 4) for n in lengths)
    assert kv.pool.num_blocks - kv.num_free_blocks == used
    assert used * 4 - sum(lengths) < len(lengths) * 4
    assert kv.usage == used / 20


def test_block_pool_rejects_double_free():
    pool = BlockPool(2)
    blocks = pool.allocate(1)
    pool.free(blocks)
    try:
        pool.free(blocks)
    except RuntimeError as err:
        assert "freed more often" in str(err)
    else:
        raise AssertionError("double free was accepted")
