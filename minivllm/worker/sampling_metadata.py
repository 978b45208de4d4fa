"""The sampler's inputs for rows of the persistent batch, built on the worker's side.

``SamplingMetadata`` and the sampler live in ``minivllm/sample/``, which knows
nothing of the batch; this reads the batch's per-row parameter arrays into
one. ``BatchSampling`` caches the result for the plain step; speculative
decoding's verifier and draft model are handed this function to build theirs.
"""

from __future__ import annotations

import numpy as np
import torch

from minivllm.sample.metadata import SamplingMetadata
from minivllm.worker.input_batch import InputBatch


def from_batch(batch: InputBatch, rows: np.ndarray, vocab_size: int, device: torch.device) -> SamplingMetadata:
    """Sampling metadata for the batch rows ``rows`` (the rows that sample, in order),
    without generators (they depend on the step: see ``BatchSampling``) and edits."""
    temps = batch.temperature[rows]
    top_k = batch.top_k[rows]
    top_k = np.where(top_k > 0, top_k, vocab_size)
    asked = [p.logprobs for p in map(batch.params.__getitem__, rows.tolist()) if p.logprobs is not None]
    return SamplingMetadata(
        temperature=torch.from_numpy(temps).to(device),
        top_k=_array_if(top_k, vocab_size, device),
        top_p=_array_if(batch.top_p[rows], 1.0, device),
        min_p=_array_if(batch.min_p[rows], 0.0, device),
        generators={},
        all_greedy=not temps.any(),
        max_num_logprobs=max(asked) if asked else None,
    )


def _array_if(values: np.ndarray, neutral, device: torch.device) -> torch.Tensor | None:
    if (values == neutral).all():
        return None
    return torch.from_numpy(values).to(device)
