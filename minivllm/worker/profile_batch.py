"""The batch of the profile run: dummy requests that fill a step's token budget.

The worker measures peak activation memory with one forward pass at the full
token budget (``ModelRunner.profile_run``), on a throw-away KV cache and batch.
"""

from __future__ import annotations

import numpy as np
import torch

from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import NewRequestData
from minivllm.request import RequestId
from minivllm.sampling_params import SamplingParams
from minivllm.utils import cdiv
from minivllm.worker.input_batch import InputBatch


def profile_batch(cfg: VllmConfig, device: torch.device) -> tuple[InputBatch, np.ndarray, int]:
    """The batch, its (B,) prompt lengths (``max_num_batched_tokens`` in all, as even as
    they can be, none over ``max_model_len``: fewer where ``max_num_seqs`` requests of
    ``max_model_len`` tokens cannot fill the budget, as no step can) and the KV blocks their tables cover."""
    budget, block_size = cfg.scheduler.max_num_batched_tokens, cfg.cache.block_size
    num_seqs = max(1, min(cfg.scheduler.max_num_seqs, cdiv(budget, cfg.max_model_len)))
    budget = min(budget, num_seqs * cfg.max_model_len)
    lens = [budget // num_seqs + (1 if i < budget % num_seqs else 0) for i in range(num_seqs)]
    blocks_per_seq = [cdiv(n, block_size) for n in lens]
    batch = InputBatch(num_seqs, cfg.max_model_len, cdiv(cfg.max_model_len, block_size))
    first_block = np.cumsum([0, *blocks_per_seq])
    for i, n in enumerate(lens):
        blocks = list(range(first_block[i], first_block[i + 1]))
        batch.add(NewRequestData(RequestId(str(i)), [0] * n, n, SamplingParams(), blocks, 0), device)
    return batch, np.asarray(lens, dtype=np.int32), sum(blocks_per_seq)
