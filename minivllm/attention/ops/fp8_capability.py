"""Where the Triton kernels can use an fp8 KV cache.

Triton has float8_e4m3fn (its fp8e4nv) from compute capability 8.9 (Ada) on; below
that neither the KV write (``triton_kv_write.py``) nor paged attention compiles for an
fp8 cache. The model runner calls ``check_fp8_kv_capability`` for the Triton backend on
a GPU before the weights load, so such a configuration fails at start-up with a
ValueError naming ``cache.cache_dtype``, never at the first launch. The torch backend
and Triton's CPU interpreter read fp8 through torch casts and are not checked.
"""

from __future__ import annotations

FP8_KV_MIN_CAPABILITY = (8, 9)
"""Triton has float8_e4m3fn (its fp8e4nv) from sm_89 (Ada) on: below that neither kernel
reading or writing an fp8 KV cache compiles."""


def check_fp8_kv_capability(capability: tuple[int, int], cache_dtype: str = "fp8") -> None:
    """Refuse an fp8 KV cache (``cache.cache_dtype=cache_dtype``) on a GPU of compute
    ``capability`` where the Triton kernels cannot read it: a ValueError at start-up
    instead of a Triton compile error at the first launch."""
    if tuple(capability) < FP8_KV_MIN_CAPABILITY:
        need = ".".join(map(str, FP8_KV_MIN_CAPABILITY))
        raise ValueError(
            f"cache.cache_dtype={cache_dtype}: the Triton attention kernels need a GPU of compute capability "
            f"{need} or newer for an fp8 KV cache (this one is {capability[0]}.{capability[1]}); "
            f"use cache.cache_dtype=auto (or float16/bfloat16), or attention.name=torch"
        )
