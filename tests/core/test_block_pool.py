import pytest

from minivllm.core.block_hash import hash_block_tokens, root_hash
from minivllm.core.block_pool import BlockPool

H = [hash_block_tokens(root_hash("t"), [i]) for i in range(8)]


def test_free_queue_is_lru_and_cached_blocks_are_evicted_only_when_needed():
    pool = BlockPool(6)
    a = pool.allocate(3)  # 0 1 2
    for block, h in zip(a, H):
        assert pool.cache_block(block, h)
    pool.free(list(reversed(a)))  # tail first: 2, 1, 0 join the back
    assert pool.free_block_ids() == [3, 4, 5, 2, 1, 0]
    assert pool.get_cached_block(H[0]) is a[0]  # freed, but still cached

    taken = pool.allocate(4)  # never-used blocks first, then the least recently freed
    assert [b.block_id for b in taken] == [3, 4, 5, 2]
    assert pool.get_cached_block(H[2]) is None and taken[-1].block_hash is None
    assert pool.get_cached_block(H[1]) is a[1] and pool.num_evictions == 1


def test_touch_revives_a_free_cached_block_from_the_middle_of_the_queue():
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    pool.cache_block(blocks[2], H[0])
    pool.free(blocks)
    pool.touch([blocks[2]])
    assert blocks[2].ref_cnt == 1
    assert pool.free_block_ids() == [0, 1, 3]
    assert [b.block_id for b in pool.allocate(3)] == [0, 1, 3]  # block 2 is safe from eviction


def test_refcounts_shared_blocks_return_only_when_the_last_holder_frees():
    pool = BlockPool(3)
    (block,) = pool.allocate(1)
    pool.cache_block(block, H[0])
    pool.touch([block])  # a second request shares it
    assert block.ref_cnt == 2
    pool.free([block])
    assert block.ref_cnt == 1 and block.block_id not in pool.free_block_ids()
    pool.free([block])
    assert pool.free_block_ids()[-1] == block.block_id
    with pytest.raises(RuntimeError, match="freed more often"):
        pool.free([block])


def test_one_block_per_hash():
    pool = BlockPool(2)
    first, second = pool.allocate(2)
    assert pool.cache_block(first, H[0])
    assert not pool.cache_block(second, H[0])  # same content computed twice: the copy stays private
    assert second.block_hash is None and pool.get_cached_block(H[0]) is first
    assert not pool.cache_block(first, H[1])  # a cached block keeps its hash


def test_usage_counts_held_blocks_and_reset_needs_all_free():
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    pool.cache_block(blocks[0], H[0])
    assert pool.usage == 0.75
    assert not pool.reset_prefix_cache()
    pool.free(blocks)
    assert pool.usage == 0.0
    assert pool.reset_prefix_cache() and pool.get_cached_block(H[0]) is None


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
