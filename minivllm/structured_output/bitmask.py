"""The worker's side of structured outputs: the step's bitmask onto the logits.

The scheduler sends one bitmask row per request with a grammar that samples in
the step (``SchedulerOutput.grammar_bitmask`` and ``structured_output_request_ids``);
the sampler masks its logits with it before any other edit, so penalties,
temperature and top-k/p see only the allowed tokens. Logprobs stay those of the
model's raw logits (finite for every token), as without a grammar.
"""

from __future__ import annotations

import numpy as np
import torch

from minivllm.request import RequestId


def bitmask_for_rows(
    bitmask: np.ndarray | None, bitmask_req_ids: list[RequestId], row_req_ids: list[RequestId], device: torch.device
) -> torch.Tensor | None:
    """The step's bitmask laid out along the sampler's rows: (N, words) int32,
    all bits set on rows without a grammar; None when the step has no bitmask."""
    if bitmask is None:
        return None
    where = {r: i for i, r in enumerate(bitmask_req_ids)}
    out = np.full((len(row_req_ids), bitmask.shape[1]), -1, dtype=np.int32)  # (N, words)
    for row, req_id in enumerate(row_req_ids):
        i = where.get(req_id)
        if i is not None:
            out[row] = bitmask[i]
    return torch.from_numpy(out).to(device, non_blocking=True)


def apply_grammar_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits: (N, V) fp32, left unchanged; returns a copy where tokens whose bit is
    0 in their row of ``bitmask`` (N, ceil(V / 32)) are -inf."""
    import xgrammar as xgr

    masked = logits.clone()
    xgr.apply_token_bitmask_inplace(masked, bitmask.to(masked.device), vocab_size=masked.shape[-1])
    return masked
