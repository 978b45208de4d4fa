"""Sorting (token, slot) pairs by expert, padded per expert to the GEMM block size.

The fused kernel processes BLOCK_M rows at a time, all of one expert. With
``topk_ids`` flattened to N = T * k entries, the pairs are laid out by expert,
each expert's run padded up to a multiple of BLOCK_M with the sentinel N::

    experts of 7 entries, BLOCK_M = 4:   ids = [1 0 1 1 0 1 3]
    sorted_ids     = [1 4 N N | 0 2 3 5 | 6 N N N]     (expert 2 got nothing: no block)
    block_experts  = [0       | 1       | 3      | -1 ...]
    num_padded     = 12

Everything is computed on the device without reading a value back to the host
(no ``.item()``), so the buffers have their worst-case size
``N + E * (BLOCK_M - 1)`` and blocks past ``num_padded`` carry expert -1.
Entries with id -1 (experts on other ranks) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AlignedRouting:
    sorted_ids: torch.Tensor
    """(max_padded,) int32: flat (token * k + slot) indices grouped by expert; N marks padding."""
    block_experts: torch.Tensor
    """(max_padded // block_m,) int32: the local expert of each block of rows; -1 = no work."""
    num_padded: torch.Tensor
    """(1,) int32: rows in use (every expert's run padded to block_m)."""


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedRouting:
    """Group the flattened ``topk_ids`` (T, k) by expert as in the module docstring."""
    flat = topk_ids.flatten()  # (N,)
    n, device = flat.numel(), flat.device
    ids = torch.where(flat < 0, torch.full_like(flat, num_experts), flat)  # -1 -> spare bucket E
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, ids, torch.ones_like(ids))  # (E+1,)
    padded = (counts[:num_experts] + block_m - 1) // block_m * block_m  # (E,)
    ends = torch.cumsum(padded, 0)  # (E,)
    starts = torch.cat([ends.new_zeros(1), ends])  # (E+1,): bucket E starts past the end
    max_padded = n + num_experts * (block_m - 1)
    max_padded = (max_padded + block_m - 1) // block_m * block_m

    sorted_e, order = torch.sort(ids, stable=True)  # (N,)
    first = torch.cumsum(counts, 0) - counts  # (E+1,) index in `order` of each expert's first entry
    rank = torch.arange(n, device=device) - first[sorted_e]
    dest = torch.where(sorted_e < num_experts, starts[sorted_e] + rank, torch.full_like(rank, max_padded))
    sorted_ids = torch.full((max_padded + 1,), n, dtype=torch.int64, device=device)
    sorted_ids.scatter_(0, dest, order)  # slot max_padded collects the left-out entries

    block_starts = torch.arange(0, max_padded, block_m, device=device)
    block_experts = torch.searchsorted(ends, block_starts, right=True)  # expert whose run covers the block
    block_experts = torch.where(block_experts < num_experts, block_experts, torch.full_like(block_experts, -1))
    return AlignedRouting(
        sorted_ids=sorted_ids[:max_padded].to(torch.int32),
        block_experts=block_experts.to(torch.int32),
        num_padded=ends[-1:].to(torch.int32) if num_experts else ends.new_zeros(1, dtype=torch.int32),
    )
