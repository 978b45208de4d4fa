"""Prefix caching and memory accounting at the KV-cache manager level (block_size 4)."""

from minivllm.core.block_hash import root_hash
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.utils import cdiv
from tests.core.scheduler_helpers import make_request

BS = 4


def manager(num_blocks: int = 16) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, enable_caching=True, hash_root=root_hash("test-model"))


def admit_and_compute(kv: KVCacheManager, request) -> int:
    """Admit ``request`` with its cached prefix and schedule its whole prompt; returns the cache hits."""
    cached = kv.get_computed_blocks(request)
    assert kv.allocate_slots(request, request.num_tokens - len(cached) * BS, cached) is not None
    request.num_computed_tokens = request.num_tokens
    return len(cached)


def test_shared_prefix_reuses_the_exact_blocks():
    kv = manager()
    a = make_request(list(range(100, 110)))  # 10 tokens: blocks of 4, 4, 2
    assert admit_and_compute(kv, a) == 0
    assert kv.block_ids(a.request_id) == [0, 1, 2]
    b = make_request(list(range(100, 108)) + [7, 7, 7])  # same first 8 tokens
    assert admit_and_compute(kv, b) == 2
    assert kv.block_ids(b.request_id) == [0, 1, 3]
    assert [kv.pool.blocks[i].ref_cnt for i in range(4)] == [2, 2, 1, 1]
    assert kv.prefix_cache_stats.queries == 21 and kv.prefix_cache_stats.hits == 8


def test_the_last_token_is_never_served_from_the_cache():
    kv = manager()
    prompt = list(range(50, 58))  # exactly two full blocks
    admit_and_compute(kv, make_request(prompt))
    again = make_request(prompt)
    assert [b.block_id for b in kv.get_computed_blocks(again)] == [0]  # not block 1: its last token must run


def test_freed_blocks_stay_cached_until_evicted():
    kv = manager(num_blocks=6)
    a = make_request(list(range(20, 28)) + [1])
    admit_and_compute(kv, a)  # blocks 0 1 2
    kv.free(a)  # tail first: the queue is 3 4 5 2 1 0
    assert kv.num_free_blocks == 6 and kv.pool.free_block_ids() == [3, 4, 5, 2, 1, 0]
    filler = make_request(list(range(300, 313)))  # 4 blocks: the never-used ones, then a's tail
    admit_and_compute(kv, filler)
    assert kv.block_ids(filler.request_id) == [3, 4, 5, 2]
    kv.free(filler)
    b = make_request(list(range(20, 28)) + [2])
    assert admit_and_compute(kv, b) == 2  # a's head survived the filler
    assert kv.block_ids(b.request_id) == [0, 1, 2]


def test_only_blocks_filled_by_scheduled_tokens_are_cached():
    kv = manager()
    a = make_request(list(range(10, 22)))  # 12 tokens
    kv.allocate_slots(a, 6, kv.get_computed_blocks(a))  # a chunk of 6 tokens is scheduled
    same = make_request(list(range(10, 22)))
    assert len(kv.get_computed_blocks(same)) == 1  # the second block is only half scheduled
    a.num_computed_tokens = 6
    kv.allocate_slots(a, 4)  # the next chunk fills block 1
    assert [b.block_id for b in kv.get_computed_blocks(same)] == [0, 1]


def test_salts_and_models_do_not_share():
    kv = manager()
    prompt = list(range(60, 69))
    admit_and_compute(kv, make_request(prompt, cache_salt="alice"))
    assert kv.get_computed_blocks(make_request(prompt, cache_salt="bob")) == []
    assert kv.get_computed_blocks(make_request(prompt)) == []
    assert len(kv.get_computed_blocks(make_request(prompt, cache_salt="alice"))) == 2
    other_model = KVCacheManager(16, BS, enable_caching=True, hash_root=root_hash("another-model"))
    other_model.pool = kv.pool  # even over the same physical blocks
    assert other_model.get_computed_blocks(make_request(prompt, cache_salt="alice")) == []


def test_admission_fails_cleanly_when_revived_blocks_leave_too_few_free():
    kv = manager(num_blocks=3)
    a = make_request(list(range(8)) + [99])
    admit_and_compute(kv, a)
    kv.free(a)  # 3 free blocks, two of them cached
    b = make_request(list(range(8)) + list(range(200, 206)))  # 14 tokens: 2 cached + 2 new blocks
    cached = kv.get_computed_blocks(b)
    assert len(cached) == 2
    assert kv.allocate_slots(b, 6, cached) is None
    assert kv.num_free_blocks == 3 and kv.block_ids(b.request_id) == []
    assert kv.prefix_cache_stats.requests == 1  # the failed attempt is not counted


def test_blocks_in_use_are_the_sum_of_ceil_len_over_block_size_minus_shared():
    kv = manager(num_blocks=64)
    system = list(range(1000, 1012))  # 12 tokens: three full blocks shared by three requests
    lengths = {"a": 5, "b": 16, "c": 1, "d": 13}
    requests = [make_request([100 * i + j for j in range(n)], req_id=k) for i, (k, n) in enumerate(lengths.items())]
    requests += [make_request(system + [i] * (i + 1), req_id=f"s{i}") for i in range(3)]
    for r in requests:
        admit_and_compute(kv, r)
    in_use = kv.pool.num_blocks - kv.num_free_blocks
    naive = sum(cdiv(r.num_tokens, BS) for r in requests)
    assert kv.num_shared_blocks() == 3 * 2  # the system prompt's 3 blocks, held twice more
    assert in_use == naive - 6
    for r in requests:  # waste: under one block per request
        assert 0 <= len(kv.block_ids(r.request_id)) * BS - r.num_tokens < BS
    for r in requests:
        kv.free(r)
    assert kv.num_free_blocks == kv.pool.num_blocks
