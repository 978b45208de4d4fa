"""The pool of physical KV-cache blocks.

Blocks are handed out from the front of the free queue and returned to its back,
so the queue's order is least-recently-freed first. It is an ordered dict keyed
by block id rather than a deque because a block must be removable from the
middle in O(1) (prefix caching revives a freed block that still holds a cached
prefix).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import NewType

BlockId = NewType("BlockId", int)


@dataclass(slots=True)
class KVCacheBlock:
    block_id: BlockId
    ref_cnt: int = 0
    """Requests currently holding this block; 0 means it sits in the free queue."""


class BlockPool:
    """Owns every block; the KV-cache manager borrows and returns them."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks}: the KV cache needs at least one block")
        self.blocks = [KVCacheBlock(BlockId(i)) for i in range(num_blocks)]
        self._free: OrderedDict[BlockId, KVCacheBlock] = OrderedDict((b.block_id, b) for b in self.blocks)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests, in [0, 1]."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def allocate(self, n: int) -> list[KVCacheBlock]:
        """Take ``n`` blocks from the front of the free queue (caller checked there are enough)."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks, {len(self._free)} free")
        taken = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
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
