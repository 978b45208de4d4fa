"""The running request's allocation fast path (``KVCacheManager._grow``) against the
general path it shortcuts (``_allocate``): same blocks, same prefix cache, same failures."""

import random

from minivllm.core.block_hash import root_hash
from minivllm.core.kv_cache_manager import KVCacheManager
from tests.core.scheduler_helpers import make_request

BS = 4


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
