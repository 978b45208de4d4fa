"""The ``scheduler`` group: what one engine step may hold (requests, tokens, encoder
outputs) and in which order waiting requests run.

Every budget is a count of at least 1; the encoder budgets default (null) to the
step's token budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from minivllm.config.validation import check_choice, check_range

SCHEDULER_POLICIES = ("fcfs", "priority")


@dataclass
class SchedulerConfig:
    """What one engine step may hold: requests, tokens and their order."""

    max_num_seqs: int = 64
    """Most requests running at once."""
    max_num_batched_tokens: int = 2048
    """Token budget of one engine step (prefill chunks + decode tokens)."""
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
        check_range("scheduler.max_num_seqs", self.max_num_seqs, low=1)
        for key in ("max_num_encoder_input_tokens", "encoder_cache_size"):
            if getattr(self, key) is not None:
                check_range(f"scheduler.{key}", getattr(self, key), low=1)
        check_range("scheduler.max_num_batched_tokens", self.max_num_batched_tokens, low=1)
        check_choice("scheduler.policy", self.policy, SCHEDULER_POLICIES)
        check_range("scheduler.log_stats_interval", self.log_stats_interval, low=0.0)
