"""What every Triton kernel wrapper checks before a launch: clear ValueErrors, never a
Triton compile error or a wrong result.

The inputs: their device, rank, strides and dtypes, and whether the kernel can run
there at all (CUDA, or the CPU under ``TRITON_INTERPRET=1``).

An fp8 KV cache: below compute capability 8.9 (``tuned_tiles.has_fp8``) neither the
KV write (``triton_kv_write.py``) nor paged attention compiles for it. The model
runner calls ``check_fp8_kv_capability`` for the Triton backend on a GPU before the
weights load, so such a configuration fails at start-up with a ValueError naming
``cache.cache_dtype``, never at the first launch. The torch backend and Triton's CPU
interpreter read fp8 through torch casts and are not checked.
"""

from __future__ import annotations

import torch
from triton.runtime.interpreter import InterpretedFunction

from minivllm.tuned_tiles import check_fp8_capability

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_tensor(t: torch.Tensor, name: str, device: torch.device, dims: int) -> None:
    """Same device as the other inputs, the expected rank, unit stride in the last dim."""
    require(t.device == device, f"{name} is on {t.device}, expected {device} (the device of the other inputs)")
    require(t.dim() == dims, f"{name} must be {dims}-D, got shape {tuple(t.shape)}")
    require(
        t.shape[-1] <= 1 or t.stride(-1) == 1, f"{name} must have unit stride in its last dim, got strides {t.stride()}"
    )


def is_interpreted(kernel: object) -> bool:
    """Whether ``kernel`` runs in Triton's interpreter (defined under TRITON_INTERPRET=1)."""
    return isinstance(kernel, InterpretedFunction)


def check_launchable(device: torch.device, kernel: object) -> None:
    """CUDA tensors, or CPU tensors when ``kernel`` was defined under TRITON_INTERPRET=1."""
    interpreted = is_interpreted(kernel)
    require(
        device.type == "cuda" or (device.type == "cpu" and interpreted),
        f"Triton kernels need CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set "
        f"before the kernels are imported; got {device} tensors (interpreter "
        f"{'on' if interpreted else 'off'})",
    )


def check_cache(
    kv_cache: torch.Tensor, device: torch.device, dtype: torch.dtype, num_kv_heads: int | None, head_dim: int
) -> None:
    """kv_cache: (2, num_blocks, block_size, num_kv_heads, head_dim) of the inputs' dtype, or fp8."""
    check_tensor(kv_cache, "kv_cache", device, dims=5)
    require(
        kv_cache.shape[0] == 2,
        f"kv_cache must be (2, num_blocks, block_size, num_kv_heads, head_dim), got {tuple(kv_cache.shape)}",
    )
    require(kv_cache.shape[4] == head_dim, f"kv_cache head_dim {kv_cache.shape[4]} != inputs' {head_dim}")
    require(
        num_kv_heads is None or kv_cache.shape[3] == num_kv_heads,
        f"kv_cache has {kv_cache.shape[3]} KV heads, inputs have {num_kv_heads}",
    )
    require(
        kv_cache.dtype in (dtype, torch.float8_e4m3fn),
        f"kv_cache dtype {kv_cache.dtype} must be the inputs' {dtype} or torch.float8_e4m3fn",
    )


def check_fp8_kv_capability(capability: tuple[int, int], cache_dtype: str = "fp8") -> None:
    """Refuse an fp8 KV cache (``cache.cache_dtype=cache_dtype``) on a GPU of compute
    ``capability`` where the Triton kernels cannot read it: a ValueError at start-up
    instead of a Triton compile error at the first launch."""
    check_fp8_capability(
        capability,
        f"cache.cache_dtype={cache_dtype}: an fp8 KV cache in the Triton attention kernels needs",
        "use cache.cache_dtype=auto (or float16/bfloat16), or attention.name=torch",
    )
