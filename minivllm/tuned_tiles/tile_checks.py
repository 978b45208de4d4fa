"""The checks every GEMM tile config shares: block sizes, warps and pipeline stages."""

from __future__ import annotations

from typing import Any

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
