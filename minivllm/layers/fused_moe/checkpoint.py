"""Checkpoint names of per-expert tensors -> the stacked parameters and their shard ids.

Hugging Face checkpoints store each expert's projections separately::

    Qwen3-MoE:  ...mlp.experts.{e}.gate_proj.weight / up_proj / down_proj
    Mixtral:    ...block_sparse_moe.experts.{e}.w1.weight / w3 / w2

Both land in ``...experts.w13`` (gate = w1, up = w3) and ``...experts.w2``
with shard id ``(e, "w1" | "w3" | "w2")`` for ``FusedMoE.weight_loader``.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2", "w1": "w1", "w3": "w3", "w2": "w2"}
_EXPERT_TENSOR = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight$")


def expert_weight_target(name: str) -> tuple[str, Any] | None:
    """(parameter name, (expert, role)) for a per-expert tensor name, else None."""
    match = _EXPERT_TENSOR.match(name)
    if match is None or match["proj"] not in _ROLE:
        return None
    role = _ROLE[match["proj"]]
    param = "w2" if role == "w2" else "w13"
    return f"{match['prefix']}.{param}", (int(match["expert"]), role)
