"""Block tables of the persistent batch: one preallocated row per batch row.

Row ``r`` holds the physical block ids of the request in batch row ``r``, in
order; only its first ``num_blocks[r]`` entries are meaningful::

    table (max_num_reqs, max_blocks_per_req) int32     num_blocks
    row 0: [ 7  2  9  0  0 ...]                         3
    row 1: [ 4  0  0  0  0 ...]                         1

Tables grow in place as the scheduler hands out blocks; a request's row is
written once when it joins the batch and then only appended to.
"""

from __future__ import annotations

import numpy as np


class BlockTable:
    def __init__(self, max_num_reqs: int, max_blocks_per_req: int) -> None:
        self.table = np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int32)

    @property
    def max_blocks_per_req(self) -> int:
        return self.table.shape[1]

    def set_row(self, row: int, block_ids: list[int]) -> None:
        n = len(block_ids)
        self._check_room(row, n)
        self.table[row, :n] = block_ids
        self.num_blocks[row] = n

    def append_row(self, row: int, block_ids: list[int]) -> None:
        start = int(self.num_blocks[row])
        end = start + len(block_ids)
        self._check_room(row, end)
        self.table[row, start:end] = block_ids
        self.num_blocks[row] = end

    def append_rows(self, rows: list[int], new_block_ids: list[list[int] | None]) -> None:
        """``append_row(rows[i], new_block_ids[i])`` for every row given blocks (None or empty:
        none); ``rows`` are distinct (one per request). When each of them gets one block, as
        in a decode step where some requests filled theirs, the blocks go in with one
        assignment instead of one per row (and a row past its width fails before any is written)."""
        given = [i for i, blocks in enumerate(new_block_ids) if blocks]
        if not all(len(new_block_ids[i]) == 1 for i in given):
            for i in given:
                self.append_row(rows[i], new_block_ids[i])
            return
        at = np.fromiter((rows[i] for i in given), dtype=np.int64, count=len(given))  # distinct rows
        ends = self.num_blocks[at] + 1
        if len(at) and ends.max() > self.max_blocks_per_req:
            self._check_room(int(at[ends.argmax()]), int(ends.max()))
        self.table[at, ends - 1] = [new_block_ids[i][0] for i in given]
        self.num_blocks[at] = ends

    def move_row(self, src: int, dst: int) -> None:
        n = int(self.num_blocks[src])
        self.table[dst, :n] = self.table[src, :n]
        self.num_blocks[dst] = n

    def clear_row(self, row: int) -> None:
        self.num_blocks[row] = 0

    def _check_room(self, row: int, n: int) -> None:
        if n > self.max_blocks_per_req:
            raise ValueError(f"batch row {row}: {n} blocks exceed max_model_len's {self.max_blocks_per_req}")
