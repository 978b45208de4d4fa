"""The fp8 KV cache (``cache.cache_dtype=fp8`` / ``fp8_e4m3``): storage and scales.

Keys and values are stored as float8_e4m3fn, one byte per element, so the same
memory holds twice the blocks of a bf16 cache. Each attention layer has two
scales: a key ``k`` is stored as ``fp8(clamp(k / k_scale, -448, 448))`` and read
back as ``float(stored) * k_scale`` (values likewise with ``v_scale``). Scales
are 1.0 unless the checkpoint carries them, under vLLM's names
(``model.layers.N.self_attn.k_scale``, ``...self_attn.k_proj.k_scale``, or
one ``kv_scale`` for both); they are read whatever the cache dtype, and used
only by an fp8 cache.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_KV_DTYPE).max)  # 448
_SCALE_RE = re.compile(r"(.*\.self_attn)\.(?:[kv]_proj\.)?(k_scale|v_scale|kv_scale)")


def is_fp8(kv_cache: torch.Tensor) -> bool:
    return kv_cache.dtype == FP8_KV_DTYPE


def quantize_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x / scale, clamped to e4m3's range and rounded to float8_e4m3fn (same shape)."""
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8_KV_DTYPE)


def dequantize_fp8(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Stored fp8 values back in ``dtype`` (same shape)."""
    return (x.float() * scale).to(dtype)


def load_kv_scale(model: nn.Module, name: str, loaded: Any) -> bool:
    """Set an attention layer's k/v scale from a checkpoint tensor named as vLLM names them;
    return False for any other name."""
    match = _SCALE_RE.fullmatch(name)
    if match is None:
        return False
    attn = model.get_submodule(f"{match.group(1)}.attn")
    tensor = loaded if isinstance(loaded, torch.Tensor) else loaded[...]  # a safetensors slice, maybe 0-d
    if tensor.numel() != 1:
        raise ValueError(
            f"checkpoint tensor {name!r}: KV-cache scales are per tensor (one value), got {tuple(tensor.shape)}"
        )
    value = float(tensor.float().reshape(()))
    if not value > 0:
        raise ValueError(f"checkpoint tensor {name!r}: a KV-cache scale must be positive, got {value}")
    kinds = ("k_scale", "v_scale") if match.group(2) == "kv_scale" else (match.group(2),)
    for kind in kinds:
        setattr(attn, kind, value)
    return True
