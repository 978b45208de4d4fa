"""Which KV-cache blocks a sliding-window model still needs.

With a window of ``w`` tokens on every attention layer, the query at position
``p`` reads keys ``p - w + 1 .. p`` only. A step whose first new token is at
position ``c`` therefore needs nothing before ``c - w + 1``, and the blocks
wholly before it can go back to the pool::

    block_size 4, window 6, next new token at c = 13:   keys needed from 8 on
    table  [ 7 | 2 | 9 | 4 ]      positions 0-3, 4-7, 8-11, 12-15
           freed freed kept kept

Freed positions keep their (stale) block ids in the table the workers hold, so
position ``p`` still lives in ``table[p // block_size]``; the attention masks
those keys out by the window, so a stale block that another request has since
reused is never attended to. When any layer attends globally (Gemma 2/3,
Qwen2 with ``max_window_layers``), every key stays needed and nothing is freed.

The window comes from the loaded model: the worker reports it in its
``KVCacheSpec`` (``minivllm/kv_cache_spec.py``, which also bounds the blocks a
request holds at once), and the engine hands it to the KV-cache manager.
"""

from __future__ import annotations


def num_blocks_out_of_window(first_new_position: int, window: int | None, block_size: int) -> int:
    """Leading blocks of a table that no query at or after ``first_new_position`` reads."""
    if window is None:
        return 0
    return max(first_new_position - window + 1, 0) // block_size
