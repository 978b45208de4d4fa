"""Tile configs of the fused-MoE kernel: a heuristic by shape, overridden by the tuned table.

One config serves both grouped GEMMs of a layer (the row blocks of the expert-sorted
layout must be the same for both). The heuristic reads the average number of rows an
expert receives, ``tokens * top_k / experts``:

==========  ======  =====================================================================
rows/expert family  tiles (BLOCK_M x BLOCK_N x BLOCK_K, GROUP_M, warps)
==========  ======  =====================================================================
<= 16       decode  16 x 64 x 128, 1, 4: every expert is one short row block and the GEMM
                    is a read of the active experts' weights: wide K steps and many
                    programs along N keep the loads in flight
<= 48       small   32 x 64 x 64, 8, 4
<= 192      medium  64 x 128 x 64, 8, 4
> 192       large   128 x 128 x 64, 8, 8: compute bound (Mixtral's 8 experts from ~1k
                    tokens): the tiles of a dense GEMM, swizzled in groups of GROUP_M row
                    blocks so a group's weight columns stay in L2
==========  ======  =====================================================================

Pipelining depth: 4 stages on sm_90 (227 KiB of shared memory a block), 3 below. The
tuned table (``minivllm/tuned_tiles/tables/fused_moe.json``) is keyed by the device's
name and ``shape_key`` and its entries replace the heuristic for that device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from minivllm.tuned_tiles import DeviceFacts, check_blocks, lookup

KERNEL = "fused_moe"


@dataclass(frozen=True)
class MoeTiles:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 1
    """Row blocks swizzled together along N (1: row-major order of the programs)."""
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        check_blocks("MoeTiles", self)
        if self.group_m < 1:
            raise ValueError(f"MoeTiles.group_m must be >= 1, got {self.group_m}")

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def name(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} w{self.num_warps} s{self.num_stages}"


# (upper bound on rows per expert, block_m, block_n, block_k, group_m, num_warps)
FAMILIES = (
    (16, 16, 64, 128, 1, 4),
    (48, 32, 64, 64, 8, 4),
    (192, 64, 128, 64, 8, 4),
    (float("inf"), 128, 128, 64, 8, 8),
)


def heuristic_tiles(tokens: int, experts: int, top_k: int, arch: int | None) -> MoeTiles:
    """The default config for ``tokens`` routed to ``top_k`` of ``experts`` on sm_``arch``
    (None: the interpreter, which ignores warps and stages)."""
    rows_per_expert = tokens * top_k / max(experts, 1)
    for bound, bm, bn, bk, group_m, warps in FAMILIES:
        if rows_per_expert <= bound:
            return MoeTiles(bm, bn, bk, group_m, warps, 4 if (arch or 0) >= 90 else 3)
    raise AssertionError("the last family has no bound")


def shape_key(experts: int, n: int, k: int, top_k: int, dtype: torch.dtype) -> str:
    """The tuned table's key of a layer: E experts of w13 (E, N=2I, K=H) with top_k routing."""
    return f"E={experts},N={n},K={k},topk={top_k},{str(dtype).removeprefix('torch.')}"


def choose_tiles(
    tokens: int, experts: int, n: int, k: int, top_k: int, dtype: torch.dtype, device: DeviceFacts
) -> MoeTiles:
    """The tuned config of this device and shape nearest to ``tokens``, else the heuristic's."""
    tuned = lookup(KERNEL, device.name, shape_key(experts, n, k, top_k, dtype), tokens)
    if tuned is not None:
        return MoeTiles(**tuned)
    return heuristic_tiles(tokens, experts, top_k, device.arch)


def tune_candidates(tokens: int, experts: int, top_k: int, arch: int | None) -> list[MoeTiles]:
    """The small set ``benchmarks/moe.py --tune`` times at one M: the heuristic's pick, its
    neighbouring row blocks, and wider or narrower N and K tiles (at most 6)."""
    base = heuristic_tiles(tokens, experts, top_k, arch)
    stages = base.num_stages
    out = [base]
    rows_per_expert = tokens * top_k / max(experts, 1)
    if rows_per_expert <= 16:
        out += [MoeTiles(16, 32, 128, 1, 4, stages), MoeTiles(16, 128, 64, 1, 4, stages), MoeTiles(16, 64, 64, 1, 4, 3)]
    elif rows_per_expert <= 192:
        out += [MoeTiles(32, 128, 64, 8, 4, stages), MoeTiles(64, 64, 64, 8, 4, stages), MoeTiles(64, 128, 64, 8, 8, 3)]
    else:
        out += [
            MoeTiles(128, 64, 64, 8, 8, stages),  # 4 warps spill on sm_80
            MoeTiles(64, 128, 64, 8, 4, stages),
            MoeTiles(128, 128, 32, 8, 4, 4),
        ]
    return list(dict.fromkeys(out))  # the heuristic's pick may already be one of the others
