"""The per-step token -> adapter-slot mapping and the torch batched LoRA op.

Tokens of one step are grouped by slot once per step (on the host, where the
slots are known); every wrapped layer then runs, per active slot, a gathered
``x[idx] @ A[slot] @ B[slot]`` and adds it into its output rows ``idx`` (the
punica / S-LoRA idea with a loop over the few slots instead of a kernel).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class LoRAStepContext:
    """Shared by every LoRA layer of one model; rewritten by the manager each step."""

    groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    """(slot, (n,) int64 token indices) for each slot used this step; empty: base model only."""

    def set_token_slots(self, token_slots: np.ndarray, device: torch.device) -> None:
        """``token_slots``: (T,) slot of each token of the step, -1 for no adapter."""
        self.groups = []
        for slot in np.unique(token_slots).tolist():
            if slot >= 0:
                idx = np.flatnonzero(token_slots == slot)
                self.groups.append((slot, torch.from_numpy(idx).to(device, non_blocking=True)))


def add_lora(
    out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, groups: list[tuple[int, torch.Tensor]]
) -> None:
    """``out[idx] += x[idx] @ a[slot] @ b[slot]`` for every (slot, idx) group, in place.

    out: (T, out_features) (may be a column slice), x: (T, in_features),
    a: (slots, in_features, max_rank), b: (slots, max_rank, out_features).
    """
    for slot, idx in groups:
        delta = (x[idx].to(a.dtype) @ a[slot]) @ b[slot]  # (n, out_features)
        out.index_add_(0, idx, delta.to(out.dtype))
