"""The ``scheduler`` group: what one engine step may hold (requests, tokens, encoder
outputs) and in which order waiting requests run.

Every budget is a count of at least 1. The two batch limits default (null) to the
device's (``scheduler_defaults.py``; ``VllmConfig`` resolves them, so every reader
sees ints); the encoder budgets default to the step's token budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from minivllm.config.validation import check_choice, check_range

SCHEDULER_POLICIES = ("fcfs", "priority")


@dataclass
class SchedulerConfig:
    """What one engine step may hold: requests, tokens and their order."""

    max_num_seqs: Optional[int] = None
    """Most requests running at once (null: the device's default, 64 on the CPU, 256 on CUDA)."""
    max_num_batched_tokens: Optional[int] = None
    """Token budget of one engine step, prefill chunks + decode tokens (null: the device's default, 2048 on the
    CPU; on CUDA 8192, or 2048 for task=serve; with chunked prefill off, at least max_model_len)."""
    enable_chunked_prefill: bool = True
    """Split prompts longer than the remaining budget across steps."""
    policy: str = "fcfs"
    """fcfs (arrival order) or priority (lower ``priority`` value first)."""
    log_stats_interval: float = 5.0
    """Seconds between engine stats log lines; 0 turns them off."""
    async_scheduling: Optional[bool] = None
    """Schedule step k+1 while the device runs step k (null: on for CUDA with one worker, off on the CPU)."""
    max_num_encoder_input_tokens: Optional[int] = None
    """Multimodal models: encoder outputs (image placeholder tokens) computed per step; null: max_num_batched_tokens."""
    encoder_cache_size: Optional[int] = None
    """Multimodal models: encoder outputs held between steps, in tokens; null: max_num_batched_tokens."""

    def __post_init__(self) -> None:
        for key in ("max_num_seqs", "max_num_batched_tokens", "max_num_encoder_input_tokens", "encoder_cache_size"):
            if getattr(self, key) is not None:
                check_range(f"scheduler.{key}", getattr(self, key), low=1)
        check_choice("scheduler.policy", self.policy, SCHEDULER_POLICIES)
        check_range("scheduler.log_stats_interval", self.log_stats_interval, low=0.0)
