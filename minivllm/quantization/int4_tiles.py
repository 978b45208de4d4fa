"""Tile configs of the int4 dequantize-GEMM: a heuristic by shape, overridden by the tuned table.

The heuristic by M (the tokens of the call), for y (M, N) = x (M, K) @ W (K, N):

=======  ==================================================================================
M        tiles (BLOCK_M x BLOCK_N x BLOCK_K, warps) and why
=======  ==================================================================================
<= 16    16 x 64 x 128, 4 (contiguous groups; 16 x 64 x 64 on the act-order path):
         decode reads the packed weight once; the product is bandwidth bound, so what
         matters is enough bytes in flight: 4 KiB of packed words a K step and stage.
         Output tiles alone are too few when N is small (N=4096: 64 tiles on 132 SMs),
         so K is split until there are two programs per SM (each split keeps >= 4 K
         steps); the fp32 partial sums are added in fp32 (``Int4Tiles.split_k``).
<= 64    32 or 64 x 64 x 64, 4, split-K as above
<= 256   64 x 128 x 64, 4; K split only up to one program per SM (the fp32 partials'
         traffic grows with M)
> 256    128 x 128 x 64, 8, split as the row above: compute bound; each weight tile is
         dequantized once per 128 rows instead of once per 16
=======  ==================================================================================

Pipelining depth: 4 stages on sm_90, 3 below. The tuned table
(``minivllm/tuned_tiles/tables/int4_gemm.json``, keyed by device name and ``shape_key``)
replaces the heuristic for the device it was measured on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

import triton

from minivllm.tuned_tiles import DeviceFacts, check_blocks, lookup

KERNEL = "int4_gemm"
MAX_SPLIT = 16


@dataclass(frozen=True)
class Int4Tiles:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    """Programs along K, each summing its share of K steps into an fp32 partial (1: none)."""
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        check_blocks("Int4Tiles", self)
        if not 1 <= self.split_k <= MAX_SPLIT:
            raise ValueError(f"Int4Tiles.split_k in 1..{MAX_SPLIT}, got {self.split_k}")

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def name(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k} split{self.split_k} w{self.num_warps} s{self.num_stages}"

    def k_per_split(self, k: int) -> int:
        """Input rows of one split: a whole number of BLOCK_K steps."""
        return triton.cdiv(triton.cdiv(k, self.split_k), self.block_k) * self.block_k

    def splits(self, k: int) -> int:
        """Splits that get any rows (split_k rounded so none is empty)."""
        return triton.cdiv(k, self.k_per_split(k))


def default_split(
    m: int, n: int, k: int, block_m: int, block_n: int, block_k: int, num_sms: int, per_sm: int = 2
) -> int:
    """Double the splits of K while the grid is under ``per_sm`` programs per SM and each
    split keeps at least four BLOCK_K steps."""
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    split = 1
    while split < MAX_SPLIT and tiles * split < per_sm * num_sms and k // (2 * split) >= 4 * block_k:
        split *= 2
    return split


def heuristic_tiles(m: int, n: int, k: int, arch: int | None, num_sms: int, act_order: bool = False) -> Int4Tiles:
    """The default config for an (M, K) x (K, N) product on sm_``arch`` with ``num_sms`` SMs;
    ``act_order``: the general path (groups through ``g_idx``), else contiguous groups."""
    stages = 4 if (arch or 0) >= 90 else 3
    if m <= 16:
        # the act-order path's per-element scale and zero gathers spill at 16 x 64 x 128 on sm_80
        bm, bn, bk, warps = 16, 64, (64 if act_order else 128), 4
    elif m <= 64:
        bm, bn, bk, warps = (32 if m <= 32 else 64), 64, 64, 4
    else:
        bm, bn, bk, warps = (64, 128, 64, 4) if m <= 256 else (128, 128, 64, 8)
        return Int4Tiles(bm, bn, bk, default_split(m, n, k, bm, bn, bk, num_sms, per_sm=1), warps, stages)
    return Int4Tiles(bm, bn, bk, default_split(m, n, k, bm, bn, bk, num_sms), warps, stages)


def shape_key(n: int, k: int, group_size: int, dtype_name: str, act_order: bool = False) -> str:
    """The tuned table's key of a weight: K inputs, N outputs, quantization group, activations'
    dtype, and ``,act_order`` for the general path (groups through ``g_idx``)."""
    return f"N={n},K={k},group={group_size},{dtype_name}" + (",act_order" if act_order else "")


def choose_tiles(
    m: int, n: int, k: int, group_size: int, dtype_name: str, device: DeviceFacts, act_order: bool = False
) -> Int4Tiles:
    """The tuned config of this device and weight nearest to ``m``, else the heuristic's."""
    tuned = lookup(KERNEL, device.name, shape_key(n, k, group_size, dtype_name, act_order), m)
    if tuned is not None:
        return Int4Tiles(**tuned)
    return heuristic_tiles(m, n, k, device.arch, device.num_sms, act_order)


def tune_candidates(m: int, n: int, k: int, arch: int | None, num_sms: int) -> list[Int4Tiles]:
    """The small set ``benchmarks/quant_gemm.py --tune`` times at one M on the contiguous-groups
    path (at most 5): the heuristic's pick and neighbours in tile width, depth and split."""
    base = heuristic_tiles(m, n, k, arch, num_sms)
    s, sm90 = base.num_stages, (arch or 0) >= 90

    def split(bm: int, bn: int, bk: int, per_sm: int = 2) -> int:
        return default_split(m, n, k, bm, bn, bk, num_sms, per_sm)

    if m <= 64:
        bm = base.block_m
        out = [
            base,
            Int4Tiles(bm, 32, 128, split(bm, 32, 128), 4, s),
            Int4Tiles(bm, 128, 64, split(bm, 128, 64), 4, s),
            Int4Tiles(bm, 64, 64, split(bm, 64, 64), 4, s),
            Int4Tiles(bm, 64, 128, max(1, split(bm, 64, 128) // 2), 4, s),  # fewer, longer splits
        ]
    elif m <= 256:
        out = [
            base,
            dataclasses.replace(base, split_k=1),
            Int4Tiles(64, 64, 64, split(64, 64, 64, 1), 4, s),
            Int4Tiles(128, 128, 64, split(128, 128, 64, 1), 8, s),
        ]
    else:
        # deeper on sm_90 (128 x 256 x 64 spills there on the contiguous path)
        wide = Int4Tiles(128, 128, 128, 1, 8, 3) if sm90 else Int4Tiles(128, 128, 32, 1, 8, 4)
        out = [base, Int4Tiles(128, 64, 64, split(128, 64, 64, 1), 4, s), Int4Tiles(64, 128, 64, 1, 4, s), wide]
    return list(dict.fromkeys(out))
