"""Tile choices of the Triton kernels: the device a launch runs on, the checks every
tile config shares, and the tuned tables.

A kernel's wrapper picks its tiles from a documented heuristic of the problem's shape
and the GPU's architecture (``DeviceFacts``); a tuned table (``tables/<kernel>.json``,
written by the kernel's benchmark with ``--tune`` on a GPU) overrides the heuristic for
the device it was measured on.

Whether the GPU has fp8 is the one device fact checked for every kernel that uses it
(``has_fp8``): Triton has float8_e4m3fn (its fp8e4nv), and the GPU the fp8 tensor cores
of ``torch._scaled_mm``, from compute capability 8.9 (Ada) on. Below that no kernel
reading or writing an fp8 KV cache compiles (``attention/ops/checks.py``'s
``check_fp8_kv_capability``, at start-up), fp8 activations are not quantized
(``quantization/triton_fp8_quant.py``) and fp8 linears dequantize their weights instead.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

TABLES_DIR = Path(__file__).resolve().parent / "tables"


@dataclass(frozen=True)
class DeviceFacts:
    """What a tile choice needs to know of the device a kernel launches on."""

    name: str
    """``torch.cuda.get_device_name``: the tuned tables' key ("cpu" for the interpreter)."""
    arch: int | None
    """Compute capability as one number (80: sm_80); None off CUDA."""
    num_sms: int
    """Streaming multiprocessors: the number of programs one wave runs."""


CPU = DeviceFacts("cpu", None, 1)


@functools.lru_cache(maxsize=None)
def _cuda_facts(index: int) -> DeviceFacts:
    major, minor = torch.cuda.get_device_capability(index)
    props = torch.cuda.get_device_properties(index)
    return DeviceFacts(torch.cuda.get_device_name(index), 10 * major + minor, props.multi_processor_count)


def device_facts(device: torch.device) -> DeviceFacts:
    """The facts of ``device``, read once per CUDA device (no synchronisation after the first)."""
    if device.type != "cuda":
        return CPU
    return _cuda_facts(device.index if device.index is not None else torch.cuda.current_device())


FP8_MIN_CAPABILITY = (8, 9)
"""The first compute capability with fp8 (module docstring)."""


def has_fp8(capability: tuple[int, int]) -> bool:
    """Whether a GPU of compute ``capability`` has fp8: Triton's float8_e4m3fn and fp8 GEMMs."""
    return tuple(capability) >= FP8_MIN_CAPABILITY


def check_fp8_capability(capability: tuple[int, int], needs: str, otherwise: str) -> None:
    """Refuse fp8 work on a GPU of compute ``capability`` without fp8: a ValueError
    ``"<needs> a GPU of compute capability 8.9 or newer (this one is X.Y); <otherwise>"``."""
    if not has_fp8(capability):
        need = ".".join(map(str, FP8_MIN_CAPABILITY))
        raise ValueError(
            f"{needs} a GPU of compute capability {need} or newer "
            f"(this one is {capability[0]}.{capability[1]}); {otherwise}"
        )


WARPS = (1, 2, 4, 8, 16)


def check_blocks(owner: str, tiles: Any) -> None:
    """Raise unless ``tiles.block_m/n/k`` are powers of two >= 16, ``num_warps`` a power of
    two <= 16 and ``num_stages`` >= 1; ``owner`` names the config class in the message."""
    for name in ("block_m", "block_n", "block_k"):
        value = getattr(tiles, name)
        if value < 16 or value & (value - 1):
            raise ValueError(f"{owner}.{name} must be a power of two >= 16, got {value}")
    if tiles.num_warps not in WARPS or tiles.num_stages < 1:
        raise ValueError(f"{owner}: num_warps a power of two <= 16, num_stages >= 1: {tiles}")


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
