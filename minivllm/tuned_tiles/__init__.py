"""Tile choices of the Triton GEMM kernels: the device a launch runs on and the tuned tables.

A kernel's wrapper picks its tiles from a documented heuristic of the problem's shape
and the GPU's architecture; a tuned table (``tables/<kernel>.json``, written by the
kernel's benchmark with ``--tune`` on a GPU) overrides the heuristic for the device it
was measured on. See ``table.py`` for the file's layout and the lookup rule.
"""

from minivllm.tuned_tiles.device import DeviceFacts, device_facts
from minivllm.tuned_tiles.table import TABLES_DIR, load_table, lookup, merge_entries, nearest_bucket, table_path

__all__ = [
    "DeviceFacts",
    "device_facts",
    "TABLES_DIR",
    "load_table",
    "lookup",
    "merge_entries",
    "nearest_bucket",
    "table_path",
]
