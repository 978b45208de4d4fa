"""Which KV-cache blocks a sliding-window model still needs.

With a window of ``w`` tokens on every attention layer, the query at position
``p`` reads keys ``p - w + 1 .. p`` only. A step whose first new token is at
position ``c`` therefore needs nothing before ``c - w + 1``, and the blocks
wholly before it can go back to the pool::

    block_size 4, window 6, next new token at c = 13:   keys needed from 8 on
    table  [ 7 | 2 | 9 | 4 ]      positions 0-3, 4-7, 8-11, 12-15
           freed freed kept kept

Freed positions keep their (stale) block ids in the table the workers hold, so
position ``p`` still lives in ``table[p // block_size]``; the attention masks
those keys out by the window, so a stale block that another request has since
reused is never attended to. When any layer attends globally (Gemma 2/3,
Qwen2 with ``max_window_layers``), every key stays needed and nothing is freed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minivllm.utils import cdiv

if TYPE_CHECKING:
    from minivllm.config.vllm_config import VllmConfig


def uniform_sliding_window(model: nn.Module) -> int | None:
    """The widest window when every attention layer has one; None when any attends globally."""
    from minivllm.layers.attention import Attention

    windows = [m.sliding_window for m in model.modules() if isinstance(m, Attention)]
    if not windows or any(w is None for w in windows):
        return None
    return max(windows)


def model_sliding_window(cfg: VllmConfig) -> int | None:
    """``uniform_sliding_window`` of the configured model, built on the meta device
    (shapes only: no memory, no weights)."""
    from minivllm.attention.torch_backend import TorchAttentionBackend
    from minivllm.models.registry import ModelRegistry

    with torch.device("meta"):
        model = ModelRegistry.resolve(cfg.architecture)(cfg.hf_config, TorchAttentionBackend())
    return uniform_sliding_window(model)


def num_blocks_out_of_window(first_new_position: int, window: int | None, block_size: int) -> int:
    """Leading blocks of a table that no query at or after ``first_new_position`` reads."""
    if window is None:
        return 0
    return max(first_new_position - window + 1, 0) // block_size


def max_blocks_per_request(num_tokens: int, block_size: int, window: int | None, max_step_tokens: int) -> int:
    """The most blocks a request of ``num_tokens`` tokens holds at once, when each
    step computes at most ``max_step_tokens`` of its tokens. With a window, a step
    holds the span from ``window - 1`` tokens before its first new token to its
    last one, which touches at most ``cdiv(span, block_size) + 1`` blocks."""
    blocks = cdiv(num_tokens, block_size)
    if window is None:
        return blocks
    return min(blocks, cdiv(window - 1 + max_step_tokens, block_size) + 1)
