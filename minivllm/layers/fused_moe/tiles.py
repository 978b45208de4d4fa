"""Tile configs of the fused-MoE kernel: a heuristic by shape, overridden by the tuned table.

One config serves both grouped GEMMs of a layer (the row blocks of the expert-sorted
layout must be the same for both). The heuristic is one table (``FAMILIES``) read by
the layer's kind of experts and the average number of rows an expert receives,
``tokens * top_k / experts``. Few large experts (``LARGE_EXPERTS``: at most 16 experts of
hidden size >= 4096, Mixtral's 8) and many small ones (Qwen3-30B-A3B's 128 of hidden 2048)
want different tiles at the same rows per expert:

=======  ==========  =======  ====================================================================
experts  rows/expert family   tiles (BLOCK_M x BLOCK_N x BLOCK_K, GROUP_M, warps)
=======  ==========  =======  ====================================================================
many     <= 16       decode   16 x 64 x 128, 1, 4: every expert is one short row block and the GEMM
                              is a read of the active experts' weights: wide K steps and many
                              programs along N keep the loads in flight
many     <= 48       small    32 x 64 x 64, 8, 4
many     <= 192      medium   64 x 128 x 64, 8, 4
many     > 192       large    128 x 128 x 64, 8, 8
few      <= 16       decode   16 x 64 x 256, 1, 4: the down projection (N = 4096, K = 14336) has
                              only N / 64 programs per active expert, so each must keep twice
                              the bytes in flight (32 KiB of weight a K step), and its K is split
                              until there are two programs an SM (``down_split``: 4 at one token)
few      <= 64       small    32 x 128 x 128, 4, 4: up to 64 rows per expert are still a read
                              of the weights; wider N and K tiles halve the K steps
few      <= 256      medium   64 x 128 x 64, 8, 4
few      > 256       large    128 x 256 x 64, 8, 8 on sm_90 (128 x 128 x 64 below): a dense
                              GEMM per expert (Mixtral's 8 experts from ~1k tokens); the wide N
                              tile halves the reads of A, GROUP_M keeps a group's weight
                              columns in L2
=======  ==========  =======  ====================================================================

Any family's down GEMM splits its K (= I) while its programs are under two an SM and each
split keeps four K steps (``MoeTiles.split_k``; in practice few large experts at decode).

Pipelining depth: 4 stages on sm_90 (227 KiB of shared memory a block), 3 below (3 on
sm_90 too where 4 stages of the tile would not fit). The tuned table
(``minivllm/tuned_tiles/tables/fused_moe.json``, written by ``benchmarks/moe.py --tune``)
is keyed by the device's name and ``shape_key`` and its entries replace the heuristic for
that device.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

import torch

from minivllm.tuned_tiles import DeviceFacts, check_blocks, lookup

KERNEL = "fused_moe"
MAX_SPLIT = 8


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class MoeTiles:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 1
    """Row blocks swizzled together along N (1: row-major order of the programs)."""
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    """Programs along I in the down GEMM, each an fp32 partial (1: none; the gate/up GEMM never splits)."""

    def __post_init__(self) -> None:
        check_blocks("MoeTiles", self)
        if self.group_m < 1:
            raise ValueError(f"MoeTiles.group_m must be >= 1, got {self.group_m}")
        if not 1 <= self.split_k <= MAX_SPLIT:
            raise ValueError(f"MoeTiles.split_k in 1..{MAX_SPLIT}, got {self.split_k}")

    def k_per_split(self, k: int) -> int:
        """Rows of K in one split: a whole number of BLOCK_K steps."""
        return _cdiv(_cdiv(k, self.split_k), self.block_k) * self.block_k

    def splits(self, k: int) -> int:
        """Splits that get any rows of K (split_k rounded so none is empty)."""
        return _cdiv(k, self.k_per_split(k))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def name(self) -> str:
        split = f" split{self.split_k}" if self.split_k > 1 else ""
        return (
            f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} w{self.num_warps} s{self.num_stages}{split}"
        )


LARGE_EXPERTS = (16, 4096)
"""(most experts, least hidden size) of a layer of few large experts."""

# kind of experts -> (upper bound on rows per expert, block_m, block_n, block_k, group_m, num_warps)
FAMILIES = {
    "many": (
        (16, 16, 64, 128, 1, 4),
        (48, 32, 64, 64, 8, 4),
        (192, 64, 128, 64, 8, 4),
        (float("inf"), 128, 128, 64, 8, 8),
    ),
    "few": (
        (16, 16, 64, 256, 1, 4),
        (64, 32, 128, 128, 4, 4),
        (256, 64, 128, 64, 8, 4),
        (float("inf"), 128, 256, 64, 8, 8),  # 128 x 128 x 64 below sm_90 (heuristic_tiles)
    ),
}


def expert_kind(experts: int, hidden: int) -> str:
    """ "few" for a layer of few large experts (``LARGE_EXPERTS``), else "many"."""
    most, least_hidden = LARGE_EXPERTS
    return "few" if experts <= most and hidden >= least_hidden else "many"


def _stages(bm: int, bn: int, bk: int, arch: int | None, itemsize: int = 2) -> int:
    """4 on sm_90 where four stages of the A and W tiles fit its shared memory, else 3."""
    per_stage = (bm * bk + bk * bn) * itemsize
    return 4 if (arch or 0) >= 90 and 4 * per_stage <= 160 * 1024 else 3


def down_split(
    tokens: int, experts: int, top_k: int, hidden: int, intermediate: int, tiles: MoeTiles, num_sms: int
) -> int:
    """Splits of the down GEMM's K (= I): doubled while its programs (row blocks with work x
    H / BLOCK_N) are under two per SM and each split keeps at least four BLOCK_K steps."""
    rows = tokens * top_k
    blocks = max(min(experts, rows), _cdiv(rows, tiles.block_m))  # at least one row block per active expert
    programs = blocks * _cdiv(hidden, tiles.block_n)
    split = 1
    while split < MAX_SPLIT and programs * split < 2 * num_sms and intermediate // (2 * split) >= 4 * tiles.block_k:
        split *= 2
    return split


def heuristic_tiles(
    tokens: int,
    experts: int,
    top_k: int,
    arch: int | None,
    hidden: int = 0,
    intermediate: int = 0,
    num_sms: int = 1,
) -> MoeTiles:
    """The default config for ``tokens`` routed to ``top_k`` of ``experts`` of hidden size
    ``hidden`` and intermediate size ``intermediate`` on sm_``arch`` (None: the interpreter,
    which ignores warps and stages) with ``num_sms`` SMs (``down_split``; 1 SM: no split)."""
    rows_per_expert = tokens * top_k / max(experts, 1)
    for bound, bm, bn, bk, group_m, warps in FAMILIES[expert_kind(experts, hidden)]:
        if rows_per_expert <= bound:
            if bn == 256 and (arch or 0) < 90:
                bn = 128
            tiles = MoeTiles(bm, bn, bk, group_m, warps, _stages(bm, bn, bk, arch))
            split = down_split(tokens, experts, top_k, hidden, intermediate, tiles, num_sms)
            return dataclasses.replace(tiles, split_k=split)
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
    return heuristic_tiles(tokens, experts, top_k, device.arch, k, n // 2, device.num_sms)


def tune_candidates(
    tokens: int,
    experts: int,
    top_k: int,
    arch: int | None,
    hidden: int = 0,
    intermediate: int = 0,
    num_sms: int = 1,
) -> list[MoeTiles]:
    """The small set ``benchmarks/moe.py --tune`` times at one M: the heuristic's pick, its
    neighbouring row blocks, and wider or narrower N and K tiles, and for few large experts
    at decode the down GEMM's split halved and doubled (at most 6)."""
    base = heuristic_tiles(tokens, experts, top_k, arch, hidden, intermediate, num_sms)
    stages = base.num_stages
    out = [base]
    rows_per_expert = tokens * top_k / max(experts, 1)
    if expert_kind(experts, hidden) == "few":
        sm90 = (arch or 0) >= 90
        if rows_per_expert <= 64:
            bm, split = base.block_m, base.split_k

            def with_split(t: MoeTiles) -> MoeTiles:
                return dataclasses.replace(
                    t, split_k=down_split(tokens, experts, top_k, hidden, intermediate, t, num_sms)
                )

            out += [
                dataclasses.replace(base, split_k=max(1, split // 2)),
                dataclasses.replace(base, split_k=min(MAX_SPLIT, split * 2)),
                with_split(MoeTiles(bm, 32, 256, base.group_m, 4, 3)),
                with_split(MoeTiles(bm, 128, 128, base.group_m, 4, 3)),
                with_split(MoeTiles(bm, 64, 128, base.group_m, 4, stages)),
            ]
        else:
            out += [
                MoeTiles(128, 128, 64, 8, 8, stages),
                MoeTiles(64, 128, 64, 8, 4, stages),
                MoeTiles(128, 256, 64, 8, 8, 3) if sm90 else MoeTiles(128, 128, 32, 8, 4, 4),
                MoeTiles(64, 256, 64, 8, 8, 3) if sm90 else MoeTiles(64, 128, 128, 8, 4, 3),
                MoeTiles(256, 128, 64, 8, 8, 3) if sm90 else MoeTiles(128, 64, 64, 8, 8, stages),
            ]
    elif rows_per_expert <= 16:
        out += [MoeTiles(16, 32, 128, 1, 4, stages), MoeTiles(16, 128, 64, 1, 4, stages), MoeTiles(16, 64, 64, 1, 4, 3)]
    elif rows_per_expert <= 192:
        out += [MoeTiles(32, 128, 64, 8, 4, stages), MoeTiles(64, 64, 64, 8, 4, stages), MoeTiles(64, 128, 64, 8, 8, 3)]
    else:
        out += [
            MoeTiles(128, 64, 64, 8, 8, stages),  # 4 warps spill on sm_80
            MoeTiles(64, 128, 64, 8, 4, stages),
            MoeTiles(128, 128, 32, 8, 4, 4),
        ]
    return list(dict.fromkeys(out))[:6]  # the heuristic's pick may already be one of the others
