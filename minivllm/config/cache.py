"""The ``cache`` group: the paged KV cache's block size, memory share, dtype and prefix caching.

How many blocks there are is never set here (unless ``num_gpu_blocks_override``
says so): the worker measures it after loading the model and reports it back
(``minivllm/kv_cache_spec.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

from minivllm.config.model import DTYPES, check_choice, check_range

CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16", "fp8", "fp8_e4m3")
KV_DTYPES = {**DTYPES, "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}
"""The torch dtype of each ``cache.cache_dtype`` but ``auto`` (which follows the model's)."""
OFFLOADING_BACKENDS = ("native",)
GiB = 1 << 30


@dataclass
class CacheConfig:
    """The paged KV cache: block size, memory share and prefix caching."""

    block_size: int = 16
    """Tokens per KV-cache block."""
    gpu_memory_utilization: float = 0.9
    """Fraction of device memory the engine may use (weights, activations and KV cache)."""
    cache_dtype: str = "auto"
    """KV-cache dtype; auto follows the model dtype; fp8 (= fp8_e4m3) stores float8_e4m3fn with per-layer scales."""
    enable_prefix_caching: Optional[bool] = None
    """Reuse the KV blocks of identical prompt prefixes across requests; null: on, except for hybrid
    linear-attention models (Qwen3-Next), which refuse it (their states are not per block)."""
    num_gpu_blocks_override: Optional[int] = None
    """Use exactly this many KV blocks instead of profiling."""
    kv_cache_memory_bytes: Optional[int] = None
    """KV-cache bytes per rank, exactly (blocks = bytes // bytes per block); overrides gpu_memory_utilization."""
    cpu_memory_gb: float = 2.0
    """Memory in GiB that stands in for device memory when the device is the CPU."""
    kv_offloading_size: Optional[float] = None
    """GiB of host memory (all tp ranks together) that keeps KV blocks evicted from the device; null: off."""
    kv_offloading_backend: str = "native"
    """How blocks reach host memory: native (minivllm's own pool and copies)."""

    def __post_init__(self) -> None:
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            raise ValueError(f"cache.block_size={self.block_size}: must be a power of two between 1 and 256")
        check_range("cache.gpu_memory_utilization", self.gpu_memory_utilization, low=0.0, high=1.0, low_open=True)
        check_choice("cache.cache_dtype", self.cache_dtype, CACHE_DTYPES)
        if self.num_gpu_blocks_override is not None:
            check_range("cache.num_gpu_blocks_override", self.num_gpu_blocks_override, low=1)
        if self.kv_cache_memory_bytes is not None:
            check_range("cache.kv_cache_memory_bytes", self.kv_cache_memory_bytes, low=1)
            if self.num_gpu_blocks_override is not None:
                raise ValueError(
                    "cache.kv_cache_memory_bytes and cache.num_gpu_blocks_override both size the KV cache; set one"
                )
        check_range("cache.cpu_memory_gb", self.cpu_memory_gb, low=0.0, low_open=True)
        check_choice("cache.kv_offloading_backend", self.kv_offloading_backend, OFFLOADING_BACKENDS)
        if self.kv_offloading_size is not None:
            check_range("cache.kv_offloading_size", self.kv_offloading_size, low=0.0, low_open=True)
            host = host_memory_bytes() / GiB
            if self.kv_offloading_size > host:
                raise ValueError(
                    f"cache.kv_offloading_size={self.kv_offloading_size}: more than this host's memory "
                    f"({host:.1f} GiB); lower it"
                )


def host_memory_bytes() -> int:
    """Physical memory of this host."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
