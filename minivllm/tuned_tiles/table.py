"""Tuned tile tables: JSON files of measured best configs, one file per kernel.

Layout of ``tables/<kernel>.json``::

    {"kernel": "fused_moe",
     "devices": {
       "NVIDIA H100 80GB HBM3": {
         "E=8,N=28672,K=4096,topk=2,bf16": {"1": {...config...}, "64": {...}, "1024": {...}}}}}

A shape key names the problem apart from M (the kernel's wrapper builds it); under it
each M bucket (a token count that was timed) maps to the config that won there. A launch
at M takes the bucket nearest to M on a log scale (M=300 between buckets 256 and 1024
takes 256), so a handful of timed Ms covers every batch size. A bucket may be null: M was
meant to be timed but was not (the tuning budget ran out, no candidate passed), and the Ms
nearest to it take the heuristic rather than a farther bucket's config (a decode tile at a
prefill M). A device or shape missing from the table falls back to the wrapper's heuristic
too. Tables are read once per process.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

TABLES_DIR = Path(__file__).resolve().parent / "tables"


@functools.lru_cache(maxsize=None)
def _read(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        return {}
    data = json.loads(p.read_text())
    if not isinstance(data.get("devices"), dict):
        raise ValueError(f"{p}: a tuned table needs a 'devices' object (device name -> shape key -> M -> config)")
    return data["devices"]


def table_path(kernel: str) -> Path:
    """The package's table of ``kernel`` (which the wrappers read and ``--tune`` writes)."""
    return TABLES_DIR / f"{kernel}.json"


def load_table(kernel: str, tables_dir: Path | None = None) -> dict:
    """device name -> shape key -> {M bucket (str): config dict}; {} when the kernel has no table.
    ``tables_dir`` None: the package's ``TABLES_DIR``."""
    return _read(str((tables_dir or TABLES_DIR) / f"{kernel}.json"))


def nearest_bucket(buckets: list[int], m: int) -> int:
    """The bucket closest to ``m`` on a log scale; ties go to the smaller bucket."""
    if not buckets:
        raise ValueError("nearest_bucket needs at least one bucket")
    return min(sorted(buckets), key=lambda b: abs(math.log2(b) - math.log2(max(m, 1))))


def lookup(kernel: str, device: str, shape_key: str, m: int, tables_dir: Path | None = None) -> dict | None:
    """The tuned config for ``m`` at ``shape_key`` on ``device``, or None where nothing was tuned
    (no entry, or the nearest bucket is null)."""
    entries = load_table(kernel, tables_dir).get(device, {}).get(shape_key)
    if not entries:
        return None
    return entries[str(nearest_bucket([int(b) for b in entries], m))]


def merge_entries(path: Path, kernel: str, device: str, shape_key: str, by_m: dict[int, dict]) -> None:
    """Write ``by_m`` (M -> config, or None: not measured) under ``device``/``shape_key`` into
    the table at ``path``, keeping every other device's and shape's entries; a None never
    replaces a config an earlier run measured."""
    data = json.loads(path.read_text()) if path.is_file() else {"kernel": kernel, "devices": {}}
    if data.get("kernel") != kernel:
        raise ValueError(f"{path} holds the table of {data.get('kernel')!r}, not {kernel!r}")
    shapes = data["devices"].setdefault(device, {})
    old = shapes.get(shape_key, {})
    new = {str(m): cfg for m, cfg in sorted(by_m.items()) if cfg is not None or old.get(str(m)) is None}
    shapes[shape_key] = {**old, **new}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    _read.cache_clear()
