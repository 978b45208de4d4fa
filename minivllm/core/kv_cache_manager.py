"""Maps requests to KV-cache blocks.

A request's blocks form its *block table*; token ``p`` of the request lives in
block ``table[p // block_size]`` at offset ``p % block_size``::

    block_size = 4, 10 tokens:   table = [7, 2, 9]
    tokens 0-3 -> block 7   tokens 4-7 -> block 2   tokens 8-9 -> block 9 (2 slots spare)

Only the last block of a request is ever partly empty, so the waste is under
one block per request.

With prefix caching, a request's table may start with blocks another request
filled (same hash, see ``block_hash.py``)::

    A: "You are a helpful ... | Q1"   table = [3, 8, 1]
    B: "You are a helpful ... | Q2"   table = [3, 8, 6]   (3 and 8 shared, ref_cnt 2)

A full block gets its hash when the step that computes it is scheduled
(``allocate_slots``), so a request admitted later in the same step can already
share it: the batch runs as one forward pass, and each attention layer writes
the keys and values of every new token before any request attends. The
scheduler never takes a scheduled request back out of its step, so a hashed
block's KV is always computed by the end of that step.

Sliding windows: with a window of ``w`` tokens on every attention layer
(``sliding_window`` set), the query at position ``p`` reads keys ``p - w + 1 .. p``
only. A step whose first new token is at position ``c`` therefore needs nothing
before ``c - w + 1``, and the blocks wholly before it can go back to the pool
(``num_blocks_out_of_window``)::

    block_size 4, window 6, next new token at c = 13:   keys needed from 8 on
    table  [ 7 | 2 | 9 | 4 ]      positions 0-3, 4-7, 8-11, 12-15
           freed freed kept kept

Each allocation first frees the leading blocks that fell out of the window of
the step's first new token. Their table positions keep the stale block objects
(so positions stay aligned, and position ``p`` still lives in
``table[p // block_size]`` in the table the workers hold) and
``_num_out_of_window`` counts them; the attention masks those keys out by the
window, so a stale block that another request has since reused is never attended
to. They were hashed when computed, stay findable in the prefix cache until
evicted, and hashes chain over token ids, not block ids, so later blocks still
hash and hit as before. When any layer attends globally (Gemma 2/3, Qwen2 with
``max_window_layers``), every key stays needed and nothing is freed.

The window comes from the loaded model: the worker reports it in its
``KVCacheSpec`` (``minivllm/kv_cache_spec.py``, which also bounds the blocks a
request holds at once), and the engine hands it to the KV-cache manager.

State slots (hybrid models, e.g. Qwen3-Next): linear-attention layers keep a fixed-size
state per request (a conv state and a recurrent state) instead of KV per token. The
workers allocate ``num_state_slots`` of them beside the blocks (``KVCacheSpec``); the
manager hands one to each request when it is admitted and takes it back in ``free``
(finished, aborted, preempted: a preempted request recomputes from scratch, so nothing
of its old state is kept). A request cannot be admitted without a free slot, as without
free blocks. The slot id travels to the workers with the request (``NewRequestData``)::

    attention layers:  table(A) = [7, 2, 9]   table(B) = [4]     paged, grows per token
    linear layers:     slot(A)  = 0           slot(B)  = 1       one each, fixed size

Without linear-attention layers there are no slots and nothing of this runs.
"""

from __future__ import annotations

from minivllm.core.block_hash import extend_block_hashes, mm_block_keys, request_extra_keys, root_hash
from minivllm.core.block_pool import BlockId, BlockPool, KVCacheBlock
from minivllm.core.stats import PrefixCacheStats
from minivllm.request import BlockHash, Request, RequestId
from minivllm.utils import cdiv


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = False,
        hash_root: BlockHash | None = None,
        sliding_window: int | None = None,
        num_state_slots: int = 0,
    ) -> None:
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.pool = BlockPool(num_blocks)
        self._tables: dict[RequestId, list[KVCacheBlock]] = {}
        self.enable_caching = enable_caching
        self.hash_root = hash_root if hash_root is not None else root_hash(None)
        self.prefix_cache_stats = PrefixCacheStats()
        self._num_hashed: dict[RequestId, int] = {}
        """Leading blocks of each table already registered in the prefix cache."""
        self._num_out_of_window: dict[RequestId, int] = {}
        """Leading blocks of each table already returned to the pool (sliding window)."""
        self.num_state_slots = num_state_slots
        self._free_state_slots = list(range(num_state_slots - 1, -1, -1))  # popped from the end: lowest first
        self._state_slot: dict[RequestId, int] = {}
        """Each admitted request's linear-attention state slot (hybrid models only)."""

    def state_slot(self, request_id: RequestId) -> int | None:
        """The request's linear-attention state slot; None without state slots (or before admission)."""
        return self._state_slot.get(request_id)

    def _lacks_state_slot(self, request: Request) -> bool:
        """Whether admitting ``request`` needs a state slot and none is free."""
        return self.num_state_slots > 0 and request.request_id not in self._state_slot and not self._free_state_slots

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def block_ids(self, request_id: RequestId) -> list[BlockId]:
        return [b.block_id for b in self._tables.get(request_id, [])]

    def blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    def blocks_to_grow(self, request: Request, num_new_tokens: int) -> int:
        """Fresh blocks a running request's table needs for ``num_new_tokens`` more tokens (an upper
        bound with a sliding window, whose blocks behind the window go back to the pool first)."""
        table = self._tables.get(request.request_id, ())
        return max(self.blocks_needed(request.num_computed_tokens + num_new_tokens) - len(table), 0)

    # ---- prefix cache ---------------------------------------------------------------
    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block; False (nothing changed) while requests hold blocks."""
        return self.pool.reset_prefix_cache()

    def get_computed_blocks(self, request: Request) -> list[KVCacheBlock]:
        """Cached blocks of the request's longest cached prefix, without claiming them.

        The last token is never taken from the cache: its logits must be computed,
        so at most ``(num_tokens - 1) // block_size`` blocks are returned. A request
        asking for prompt logprobs reads nothing: they need every prompt position's logits.
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return []
        hashes = self._block_hashes(request, request.all_token_ids)
        found = []
        for block_hash in hashes[: (request.num_tokens - 1) // self.block_size]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            found.append(block)
        return found

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Register in the prefix cache the request's full blocks among its first
        ``num_tokens`` tokens (computed, or being computed in the step being scheduled).
        Tokens not known yet (async scheduling's placeholders) are never hashed."""
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return
        table = self._tables.get(request.request_id)
        if table is None:
            return
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        start = self._num_hashed.get(request.request_id, 0)
        if num_full <= start:
            return
        hashes = request.block_hashes
        if len(hashes) < num_full:  # hash the tokens after the last hashed block, not the whole sequence
            offset = len(hashes) * self.block_size
            tail = request.token_ids_from(offset)[: num_full * self.block_size - offset]
            hashes = self._block_hashes(request, tail, offset)
        for i in range(start, num_full):
            self.pool.cache_block(table[i], hashes[i])
        self._num_hashed[request.request_id] = num_full

    def _block_hashes(self, request: Request, token_ids: list[int], offset: int = 0) -> list[BlockHash]:
        """The request's block hashes, extended over ``token_ids`` (its tokens from ``offset`` on)."""
        extra_keys = request_extra_keys(request.cache_salt, request.lora_int_id)
        block_keys = mm_block_keys(request.mm_features, self.block_size) if request.mm_features else None
        return extend_block_hashes(
            request.block_hashes, token_ids, self.block_size, self.hash_root, extra_keys, offset, block_keys
        )

    # ---- allocation -----------------------------------------------------------------
    def has_room(self, request: Request, num_new_tokens: int) -> bool:
        """Whether ``allocate_slots(request, num_new_tokens)`` would change nothing: the
        table holds the tokens and no block fills up (the common decode step). The
        scheduler asks this first, once per running request per step."""
        table = self._tables.get(request.request_id)
        if table is None or self.sliding_window is not None:  # a window frees blocks as it slides
            return False
        total = request.num_computed_tokens + num_new_tokens
        if total > len(table) * self.block_size:
            return False
        # A token that fills a block not yet hashed needs cache_blocks.
        return not self.enable_caching or total // self.block_size <= self._num_hashed.get(request.request_id, 0)

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: list[KVCacheBlock] | None = None
    ) -> list[BlockId] | None:
        """Grow the request's table to hold ``num_computed_tokens + num_new_tokens``.

        ``new_computed_blocks`` is given when a waiting request is admitted: the
        result of ``get_computed_blocks`` (possibly empty), which then head its
        table; the caller advances ``num_computed_tokens`` past them.
        Returns the ids of the newly allocated blocks (possibly none), or None,
        with nothing changed, when too few blocks are free.
        """
        table = self._tables.get(request.request_id)
        if new_computed_blocks is None and table is not None and self.sliding_window is None:
            return self._grow(request, table, request.num_computed_tokens + num_new_tokens)
        return self._allocate(request, num_new_tokens, new_computed_blocks)

    def _allocate(
        self, request: Request, num_new_tokens: int, new_computed_blocks: list[KVCacheBlock] | None
    ) -> list[BlockId] | None:
        """``allocate_slots`` in general (admission, a sliding window); the reference for ``_grow``."""
        computed = new_computed_blocks or []
        needed = self._num_blocks_to_allocate(request, num_new_tokens, computed)
        if needed is None or self._lacks_state_slot(request):
            return None
        if self.num_state_slots and request.request_id not in self._state_slot:  # admission
            self._state_slot[request.request_id] = self._free_state_slots.pop()
        table = self._tables.setdefault(request.request_id, [])
        if new_computed_blocks is not None:
            self.pool.touch(computed)
            table.extend(computed)
            self._num_hashed[request.request_id] = len(computed)
            if self.enable_caching:
                self.prefix_cache_stats.record(request.num_tokens, len(computed) * self.block_size)
        self._free_out_of_window(request, table, request.num_computed_tokens + len(computed) * self.block_size)
        new_blocks = self.pool.allocate(needed)
        table.extend(new_blocks)
        self.cache_blocks(request, request.num_computed_tokens + len(computed) * self.block_size + num_new_tokens)
        return [b.block_id for b in new_blocks]

    def _grow(self, request: Request, table: list[KVCacheBlock], total: int) -> list[BlockId] | None:
        """``allocate_slots`` for a running request without a sliding window (every
        decode step): ``_allocate``'s result without its cases that cannot apply here
        (no cached blocks to take, no window to slide)."""
        needed = -(-total // self.block_size) - len(table)
        new_ids = []
        if needed > 0:
            if needed > self.pool.num_free_blocks:
                return None
            new_blocks = self.pool.allocate(needed)
            table.extend(new_blocks)
            new_ids = [b.block_id for b in new_blocks]
        if self.enable_caching and total // self.block_size > self._num_hashed.get(request.request_id, 0):
            self.cache_blocks(request, total)  # a block filled up
        return new_ids

    def can_allocate(
        self, request: Request, num_new_tokens: int, new_computed_blocks: list[KVCacheBlock] | None = None
    ) -> bool:
        """Whether ``allocate_slots`` with the same arguments would succeed now."""
        if self._lacks_state_slot(request):
            return False
        return self._num_blocks_to_allocate(request, num_new_tokens, new_computed_blocks or []) is not None

    def _num_blocks_to_allocate(
        self, request: Request, num_new_tokens: int, computed: list[KVCacheBlock]
    ) -> int | None:
        """Fresh blocks needed for the new tokens, or None when they (plus the cached
        blocks taken out of the free queue) exceed the free blocks."""
        table = self._tables.get(request.request_id, [])
        first_new = request.num_computed_tokens + len(computed) * self.block_size
        needed = max(self.blocks_needed(first_new + num_new_tokens) - len(table) - len(computed), 0)
        if self.sliding_window is None:
            revived = sum(1 for b in computed if b.ref_cnt == 0)
            return needed if needed + revived <= self.pool.num_free_blocks else None
        # Computed blocks past the window cut leave the free queue (if free); those before it
        # are touched and freed again at once. Held blocks before the cut return to the pool.
        cut = num_blocks_out_of_window(first_new, self.sliding_window, self.block_size)
        revived = sum(1 for b in computed[max(cut - len(table), 0) :] if b.ref_cnt == 0)
        done = self._num_out_of_window.get(request.request_id, 0)
        reclaimed = sum(1 for b in table[done:cut] if b.ref_cnt == 1)
        return needed if needed + revived <= self.pool.num_free_blocks + reclaimed else None

    def _free_out_of_window(self, request: Request, table: list[KVCacheBlock], first_new: int) -> None:
        """Return the blocks before the window of the token at ``first_new`` (no-op without a window)."""
        cut = num_blocks_out_of_window(first_new, self.sliding_window, self.block_size)
        done = self._num_out_of_window.get(request.request_id, 0)
        if cut > done:
            self.pool.free(table[done:cut])
            self._num_out_of_window[request.request_id] = cut

    def truncate(self, request: Request, num_tokens: int) -> None:
        """Keep only the blocks that hold the first ``num_tokens`` tokens; the rest
        (rejected speculative tokens' slots) return to the pool, last first."""
        table = self._tables.get(request.request_id)
        if table is None:
            return
        keep = self.blocks_needed(num_tokens)
        if self._num_hashed.get(request.request_id, 0) > keep:
            raise RuntimeError(f"request {request.request_id}: truncating hashed blocks")
        extra = table[keep:]
        del table[keep:]
        self.pool.free(list(reversed(extra)))

    def uncache(self, request: Request, first_block: int) -> None:
        """Take the request's blocks from ``first_block`` on out of the prefix cache (their
        KV is wrong: a KV connector's load failed); they are hashed again once recomputed."""
        table = self._tables.get(request.request_id, [])
        for block in table[first_block:]:
            self.pool.uncache_block(block)
        if self._num_hashed.get(request.request_id, 0) > first_block:
            self._num_hashed[request.request_id] = first_block

    def free(self, request: Request) -> None:
        """Return the request's blocks, last block first, so the tail of a
        sequence is evicted before its head (its head is likelier to be shared)."""
        table = self._tables.pop(request.request_id, [])
        self._num_hashed.pop(request.request_id, None)
        if (slot := self._state_slot.pop(request.request_id, None)) is not None:
            self._free_state_slots.append(slot)
        done = self._num_out_of_window.pop(request.request_id, 0)
        self.pool.free(list(reversed(table[done:])))

    def num_shared_blocks(self) -> int:
        """Extra references beyond the first on blocks in use (for memory accounting)."""
        return sum(b.ref_cnt - 1 for b in self.pool.blocks if b.ref_cnt > 1)


def num_blocks_out_of_window(first_new_position: int, window: int | None, block_size: int) -> int:
    """Leading blocks of a table that no query at or after ``first_new_position`` reads."""
    if window is None:
        return 0
    return max(first_new_position - window + 1, 0) // block_size
