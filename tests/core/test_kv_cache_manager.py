"""The KV-cache manager: block tables, prefix caching, the running request's fast path and
sliding windows, with exact block ids and order (block_size 4)."""

import random

from minivllm.core.block_hash import root_hash
from minivllm.core.kv_cache_manager import KVCacheManager, num_blocks_out_of_window
from minivllm.utils import cdiv
from tests.core.scheduler_helpers import make_request

BS = 4


def numbered_request(req_id: str, num_prompt_tokens: int):
    return make_request(list(range(10, 10 + num_prompt_tokens)), req_id=req_id)


def manager(num_blocks: int = 16) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, enable_caching=True, hash_root=root_hash("test-model"))


def admit_and_compute(kv: KVCacheManager, request) -> int:
    """Admit ``request`` with its cached prefix and schedule its whole prompt; returns the cache hits."""
    cached = kv.get_computed_blocks(request)
    assert kv.allocate_slots(request, request.num_tokens - len(cached) * BS, cached) is not None
    request.num_computed_tokens = request.num_tokens
    return len(cached)


# ---- block allocation without prefix caching: exact block ids, order and accounting ----


def test_allocation_takes_blocks_from_the_front_in_order():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = numbered_request("a", 9)
    assert kv.allocate_slots(a, 9) == [0, 1, 2]
    b = numbered_request("b", 4)
    assert kv.allocate_slots(b, 4) == [3]
    assert kv.block_ids("a") == [0, 1, 2]
    assert kv.num_free_blocks == 4


def test_growing_within_the_last_block_needs_no_new_block():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    r = numbered_request("r", 5)
    assert kv.allocate_slots(r, 5) == [0, 1]
    r.num_computed_tokens = 5
    assert kv.allocate_slots(r, 3) == []  # 8 tokens still fit two blocks
    r.num_computed_tokens = 8
    assert kv.allocate_slots(r, 1) == [2]


def test_allocation_fails_without_side_effects_when_blocks_run_out():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    assert kv.allocate_slots(numbered_request("a", 8), 8) == [0, 1]
    b = numbered_request("b", 9)
    assert kv.allocate_slots(b, 9) is None
    assert kv.block_ids("b") == []
    assert kv.num_free_blocks == 1


def test_freed_blocks_return_tail_first_to_the_back_of_the_queue():
    kv = KVCacheManager(num_blocks=6, block_size=4)
    a = numbered_request("a", 12)
    kv.allocate_slots(a, 12)  # blocks 0, 1, 2
    kv.free(a)
    assert kv.pool.free_block_ids() == [3, 4, 5, 2, 1, 0]
    b = numbered_request("b", 16)
    assert kv.allocate_slots(b, 16) == [3, 4, 5, 2]


def test_usage_and_waste_under_one_block_per_request():
    kv = KVCacheManager(num_blocks=20, block_size=4)
    lengths = [1, 4, 5, 11, 16]
    for i, n in enumerate(lengths):
        kv.allocate_slots(numbered_request(str(i), n), n)
    used = sum(-(-n // 4) for n in lengths)
    assert kv.pool.num_blocks - kv.num_free_blocks == used
    assert used * 4 - sum(lengths) < len(lengths) * 4
    assert kv.usage == used / 20


# ---- prefix caching and memory accounting ----------------------------------------------


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


# ---- the running request's allocation fast path (``_grow``) against the general path it
# shortcuts (``_allocate``): same blocks, same prefix cache, same failures ----------------


def _twins(num_blocks: int) -> tuple[KVCacheManager, KVCacheManager]:
    fast = KVCacheManager(num_blocks, BS, enable_caching=True, hash_root=root_hash("m"))
    reference = KVCacheManager(num_blocks, BS, enable_caching=True, hash_root=root_hash("m"))
    reference._grow = lambda request, table, total: reference._allocate(
        request, total - request.num_computed_tokens, None
    )
    return fast, reference


def _state(kv: KVCacheManager, requests) -> tuple:
    cached = sorted((h, b.block_id) for h, b in kv.pool.cached.items())
    tables = [kv.block_ids(r.request_id) for r in requests]
    hashed = [kv._num_hashed.get(r.request_id) for r in requests]
    return tables, hashed, kv.pool.free_block_ids(), cached, [tuple(r.block_hashes) for r in requests]


def _step(kv: KVCacheManager, request, rng: random.Random, token: int):
    """One scheduling decision for ``request``: admit it, or grow it by a chunk or a decode token."""
    if request.request_id not in kv._tables:
        cached = kv.get_computed_blocks(request)
        num_new = min(request.num_tokens - len(cached) * BS, rng.randint(1, 9))
        result = kv.allocate_slots(request, num_new, cached)
        if result is not None:
            request.num_computed_tokens = len(cached) * BS + num_new
        return result
    if request.num_computed_tokens == request.num_tokens:
        request.output_token_ids.append(token)  # it sampled in its last step
    num_new = min(request.num_tokens - request.num_computed_tokens, rng.randint(1, 6))
    result = kv.allocate_slots(request, num_new)
    if result is None:
        kv.free(request)  # preempted: recomputed from its cached prefix later
        request.num_computed_tokens = 0
    else:
        request.num_computed_tokens += num_new
    return result


def test_grow_equals_the_general_path_with_sharing_eviction_and_failures():
    fast, reference = _twins(num_blocks=14)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 30, 31], [40] * 13, [1, 2, 3, 4, 50]]
    mine = [make_request(p, req_id=f"f{i}") for i, p in enumerate(prompts)]
    theirs = [make_request(p, req_id=f"f{i}") for i, p in enumerate(prompts)]
    rng_fast, rng_ref, tokens = random.Random(0), random.Random(0), random.Random(1)
    num_failures = 0
    for _ in range(60):
        for a, b in zip(mine, theirs):
            token = tokens.randrange(100)
            got = _step(fast, a, rng_fast, token)
            assert got == _step(reference, b, rng_ref, token)
            num_failures += got is None
            assert _state(fast, mine) == _state(reference, theirs)
    assert num_failures > 0 and fast.pool.num_evictions > 0  # the run reached the cases that could differ


# ---- sliding windows: blocks that fell out of every layer's window go back to the pool ----


def test_blocks_before_the_window_of_the_next_token_are_freed():
    """block_size 4, window 6: the token at position p reads keys p-5 .. p."""
    kv = KVCacheManager(num_blocks=8, block_size=4, sliding_window=6)
    request = make_request(list(range(10, 20)), max_tokens=8)  # 10 prompt tokens
    assert kv.allocate_slots(request, 10) == [0, 1, 2]
    request.num_computed_tokens = 10
    for token in range(8):  # decode: the new token sits at position 10, 11, ...
        request.output_token_ids.append(token)
        kv.allocate_slots(request, 1)
        first_needed_block = max(request.num_computed_tokens - 5, 0) // 4
        held = len(kv.block_ids(request.request_id)) - first_needed_block
        assert kv.num_free_blocks == 8 - held
        request.num_computed_tokens += 1
    # position 17 reads 12..17: blocks 0, 1 and 2 (positions 0-11) were freed, in that order
    assert kv.block_ids(request.request_id) == [0, 1, 2, 3, 4]  # stale ids keep positions aligned
    assert kv.pool.free_block_ids() == [5, 6, 7, 0, 1, 2]
    kv.free(request)
    assert kv.num_free_blocks == 8  # the out-of-window blocks are not freed twice


def test_without_a_window_every_block_stays():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    request = make_request(list(range(10, 30)), max_tokens=1)
    kv.allocate_slots(request, 20)
    request.num_computed_tokens = 20
    request.output_token_ids.append(5)
    kv.allocate_slots(request, 1)
    assert kv.num_free_blocks == 8 - 6


def test_a_prefix_hit_past_the_window_frees_the_hit_blocks_it_no_longer_needs():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_caching=True, sliding_window=6)
    prompt = list(range(10, 23))  # 13 tokens: 3 full blocks
    first = make_request(prompt, max_tokens=1)
    kv.allocate_slots(first, 13)
    first.num_computed_tokens = 13
    kv.free(first)
    second = make_request(prompt, max_tokens=1)
    cached = kv.get_computed_blocks(second)
    assert [b.block_id for b in cached] == [0, 1, 2]
    assert kv.allocate_slots(second, 1, cached) == [4]  # position 12 starts a new block
    # position 12 reads 7..12: hit block 0 (positions 0-3) is free again, still cached
    assert kv.num_free_blocks == 8 - 3 and kv.pool.free_block_ids()[-1] == 0
    assert [b.block_id for b in kv.get_computed_blocks(make_request(prompt))] == [0, 1, 2]


def test_blocks_out_of_the_window_of_a_position():
    assert num_blocks_out_of_window(13, 6, 4) == 2 and num_blocks_out_of_window(13, None, 4) == 0


# ---- state slots (hybrid models): one per admitted request, beside the blocks ----


def test_state_slots_taken_at_admission_freed_with_the_blocks():
    kv = KVCacheManager(num_blocks=8, block_size=4, num_state_slots=2)
    a, b, c = numbered_request("a", 5), numbered_request("b", 3), numbered_request("c", 2)
    assert kv.allocate_slots(a, 5, []) == [0, 1]
    assert kv.allocate_slots(b, 3, []) == [2]
    assert (kv.state_slot("a"), kv.state_slot("b")) == (0, 1)
    a.num_computed_tokens = 5
    assert kv.allocate_slots(a, 3) == [] and kv.state_slot("a") == 0  # growing keeps the slot
    # no slot left: c is not admitted although blocks are free, and nothing changes
    assert not kv.can_allocate(c, 2, [])
    assert kv.allocate_slots(c, 2, []) is None
    assert kv.state_slot("c") is None and kv.num_free_blocks == 5
    kv.free(a)  # finished or preempted: its slot goes back with its blocks
    assert kv.state_slot("a") is None
    assert kv.can_allocate(c, 2, [])
    assert kv.allocate_slots(c, 2, []) == [3]  # the free queue's front; the freed slot 0
    assert kv.state_slot("c") == 0


def test_no_state_slots_without_linear_layers():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = numbered_request("a", 5)
    assert kv.allocate_slots(a, 5, []) == [0, 1]
    assert kv.state_slot("a") is None
