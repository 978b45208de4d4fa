"""Maps requests to KV-cache blocks.

A request's blocks form its *block table*; token ``p`` of the request lives in
block ``table[p // block_size]`` at offset ``p % block_size``::

    block_size = 4, 10 tokens:   table = [7, 2, 9]
    tokens 0-3 -> block 7   tokens 4-7 -> block 2   tokens 8-9 -> block 9 (2 slots spare)

Only the last block of a request is ever partly empty, so the waste is under
one block per request.
"""
from __future__ import annotations

from minivllm.core.block_pool import BlockId, BlockPool, KVCacheBlock
from minivllm.engine.request import Request, RequestId
from minivllm.utils import cdiv


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self._tables: dict[RequestId, list[KVCacheBlock]] = {}

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

    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether a request of ``num_tokens`` fits the whole cache when alone."""
        return self.blocks_needed(num_tokens) <= self.pool.num_blocks

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[BlockId] | None:
        """Grow the request's table to hold ``num_computed_tokens + num_new_tokens``.

        Returns the ids of the newly added blocks (possibly none), or None, with
        nothing changed, when too few blocks are free.
        """
        table = self._tables.setdefault(request.request_id, [])
        needed = self.blocks_needed(request.num_computed_tokens + num_new_tokens) - len(table)
        if needed <= 0:
            return []
        if needed > self.pool.num_free_blocks:
            return None
        new_blocks = self.pool.allocate(needed)
        table.extend(new_blocks)
        return [b.block_id for b in new_blocks]

    def free(self, request: Request) -> None:
        """Return the request's blocks, last block first, so the tail of a
        sequence is reused before its head."""
        table = self._tables.pop(request.request_id, [])
        self.pool.free(list(reversed(table)))
