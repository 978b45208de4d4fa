"""Sampling inputs for hand-made rows, made the one way the engine makes them."""

from __future__ import annotations

import numpy as np
import torch

from minivllm.sample.metadata import SamplingMetadata, SamplingRows
from minivllm.sampling_params import SamplingParams

CPU = torch.device("cpu")


def sampling_metadata(params: list[SamplingParams]) -> SamplingMetadata:
    """The sampler's inputs (on the CPU) for one row per request of ``params``, as a batch's rows
    give them (``SamplingRows.metadata``), without generators and logit edits."""
    rows = SamplingRows(len(params), CPU)
    for row, p in enumerate(params):
        rows.set_row(row, p)
    return rows.metadata(np.arange(len(params)))
