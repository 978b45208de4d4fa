"""The pool of physical KV-cache blocks, and the prefix cache's index of them.

Blocks are handed out from the front of the free queue and returned to its back,
so the queue's order is least-recently-freed first. It is an ordered dict keyed
by block id rather than a deque because a block must be removable from the
middle in O(1): prefix caching revives a freed block that still holds a cached
prefix.

A full block whose KV has been computed may carry a ``block_hash`` (see
``block_hash.py``) and is then listed in ``cached``. Freeing a block keeps its
hash: the block sits in the free queue, still findable, until the front of the
queue reaches it and it is handed out for new tokens (evicted). So cached
blocks are evicted least-recently-used first, and only when a free block is
actually needed::

    free queue (front -> back):  [ 5 | 9 (hash a) | 2 (hash b) | 7 ]
    allocate(2) -> 5, 9          (9 is evicted: hash a is forgotten)
    touch([2])  -> 2 leaves the queue, ref_cnt 1: a request shares it
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import NewType

from minivllm.request import BlockHash

BlockId = NewType("BlockId", int)


@dataclass(slots=True)
class KVCacheBlock:
    block_id: BlockId
    ref_cnt: int = 0
    """Requests currently holding this block; 0 means it sits in the free queue."""
    block_hash: BlockHash | None = None
    """Set while the block holds a cached full block of tokens."""


class BlockPool:
    """Owns every block; the KV-cache manager borrows and returns them."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks}: the KV cache needs at least one block")
        self.blocks = [KVCacheBlock(BlockId(i)) for i in range(num_blocks)]
        self._free: OrderedDict[BlockId, KVCacheBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[BlockHash, KVCacheBlock] = {}
        """Hash -> the block holding it (in use or free)."""
        self.num_evictions = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests, in [0, 1] (free cached blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def allocate(self, n: int) -> list[KVCacheBlock]:
        """Take ``n`` blocks from the front of the free queue (caller checked there are enough),
        evicting any cached prefix they held."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks, {len(self._free)} free")
        taken = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            taken.append(block)
        return taken

    def free(self, blocks: list[KVCacheBlock]) -> None:
        """Drop one reference from each block; unreferenced ones join the back of the queue."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt < 0:
                raise RuntimeError(f"block {block.block_id} freed more often than allocated")
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def free_block_ids(self) -> list[BlockId]:
        """The free queue, front first (for tests and debugging)."""
        return list(self._free)

    # ---- prefix cache ---------------------------------------------------------------
    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached.get(block_hash)

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Add a reference to each cached block, taking free ones out of the queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def cache_block(self, block: KVCacheBlock, block_hash: BlockHash) -> bool:
        """Record that ``block`` holds the tokens named by ``block_hash``. False (nothing
        changed) when the block is cached already or another block holds that hash."""
        if block.block_hash is not None or block_hash in self.cached:
            return False
        block.block_hash = block_hash
        self.cached[block_hash] = block
        return True

    def uncache_block(self, block: KVCacheBlock) -> None:
        """Forget the prefix that ``block`` holds (its KV is wrong); it stays with its owners."""
        if block.block_hash is not None and self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
        block.block_hash = None

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
        block.block_hash = None
        self.num_evictions += 1

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible while no request holds a block."""
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        return True
