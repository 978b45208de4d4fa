"""The per-step token -> adapter-slot mapping and the torch batched LoRA op.

Tokens of one step are grouped by slot once per step (on the host, where the
slots are known); every wrapped layer then runs, per active slot, a gathered
``x[idx] @ A[slot] @ B[slot]`` and adds it into its output rows ``idx`` (the
punica / S-LoRA idea with a loop over the few slots instead of a kernel).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch


@dataclass
class LoRAStepContext:
    """Shared by every LoRA layer of one model; rewritten by the manager each step
    (the torch path reads ``groups``, the Triton kernels ``segments()``)."""

    groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    """(slot, (n,) int64 token indices) for each slot used this step; empty: base model only."""

    token_idx: torch.Tensor | None = None
    """(n,) the adapted tokens, slot by slot (the groups' indices concatenated)."""
    seg_slot: torch.Tensor | None = None
    """(segments,) int32 slot of each group; ``seg_start`` / ``seg_len`` its span of ``token_idx``."""
    seg_start: torch.Tensor | None = None
    seg_len: torch.Tensor | None = None
    max_len: int = 0
    """Tokens in the largest group (the kernels' grid)."""

    def set_token_slots(self, token_slots: np.ndarray, device: torch.device) -> None:
        """``token_slots``: (T,) slot of each token of the step, -1 for no adapter."""
        self.groups = []
        slots, idx = [], []
        for slot in np.unique(token_slots).tolist():
            if slot >= 0:
                slots.append(slot)
                idx.append(np.flatnonzero(token_slots == slot))
        if not slots:
            return
        flat = torch.from_numpy(np.concatenate(idx)).to(device, non_blocking=True)
        lens = [len(i) for i in idx]
        starts = np.cumsum([0, *lens[:-1]])
        self.groups = [(s, flat[st : st + n]) for s, st, n in zip(slots, starts.tolist(), lens)]
        meta = torch.tensor([slots, starts.tolist(), lens], dtype=torch.int32).to(device, non_blocking=True)
        self.token_idx, self.seg_slot, self.seg_start, self.seg_len = flat, meta[0], meta[1], meta[2]
        self.max_len = max(lens)

    def segments(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """The kernels' view of the groups: token_idx, seg_slot, seg_start, seg_len, max_len."""
        return self.token_idx, self.seg_slot, self.seg_start, self.seg_len, self.max_len


def add_lora(
    out: torch.Tensor,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    groups: list[tuple[int, torch.Tensor]],
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """``out[idx] += x[idx] @ a[slot] @ b[slot]`` for every (slot, idx) group, in place.

    out: (T, out_features) (may be a column slice), x: (T, in_features),
    a: (slots, in_features, max_rank), b: (slots, max_rank, out_features).
    ``reduce``: for a row-parallel layer, sums the (T, max_rank) shrink results over
    the ranks (each holds a slice of the input features) before the expand.
    """
    if reduce is not None:
        shrunk = torch.zeros(x.shape[0], a.shape[2], dtype=a.dtype, device=x.device)  # (T, max_rank)
        for slot, idx in groups:
            shrunk.index_copy_(0, idx, x[idx].to(a.dtype) @ a[slot])
        shrunk = reduce(shrunk)
        for slot, idx in groups:
            out.index_add_(0, idx, (shrunk[idx] @ b[slot]).to(out.dtype))
        return
    for slot, idx in groups:
        delta = (x[idx].to(a.dtype) @ a[slot]) @ b[slot]  # (n, out_features)
        out.index_add_(0, idx, delta.to(out.dtype))
