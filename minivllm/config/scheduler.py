"""The ``scheduler`` group: what one engine step may hold (requests, tokens, encoder
outputs), in which order waiting requests run, and whether scheduling overlaps the device.

Every budget is a count of at least 1. The two batch limits default (null) to the
device's (below; ``VllmConfig`` resolves them, so every reader sees ints); the encoder
budgets default to the step's token budget.

The device's batch limits: on the CPU a step of 64 requests and 2,048 tokens is
already long, so those stay. On CUDA the limits follow vLLM's defaults for a GPU it
does not single out (its larger values need the device's memory and name, a query
that would start a CUDA context in the process that builds the config, before any
worker runs): 256 requests, and 8,192 tokens a step offline (``LLM``, task=generate,
task=bench) but 2,048 for task=serve, where a shorter prefill step keeps decode
latency low. The default CUDA graphs
(``compilation.cudagraph_capture_sizes=null``) reach ``max_num_seqs``, so every decode batch replays a
captured graph, and the token budget is what the worker's profile run measures before
it sizes the KV cache. With chunked prefill off, a null token budget is at least
``max_model_len`` (as in vLLM), so that every prompt the context length admits can be
scheduled in one step. Explicit values always win; ``VllmConfig`` resolves them once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from minivllm.config.model import check_choice, check_range

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
    num_scheduler_steps: int = 1
    """Decode steps run back to back per engine step when every running request decodes, none has a
    grammar or history-reading sampling (penalties, bad words, logits processors) and none waits (multi-step
    scheduling): the worker feeds each step's tokens to the next on the device, and the host checks stops
    and streams once per N tokens; tokens past a stop are computed and dropped."""

    def __post_init__(self) -> None:
        check_range("scheduler.num_scheduler_steps", self.num_scheduler_steps, low=1)
        for key in ("max_num_seqs", "max_num_batched_tokens", "max_num_encoder_input_tokens", "encoder_cache_size"):
            if getattr(self, key) is not None:
                check_range(f"scheduler.{key}", getattr(self, key), low=1)
        check_choice("scheduler.policy", self.policy, SCHEDULER_POLICIES)
        check_range("scheduler.log_stats_interval", self.log_stats_interval, low=0.0)


@dataclass(frozen=True)
class BatchLimits:
    """Most requests running at once and the token budget of one step."""

    max_num_seqs: int
    max_num_batched_tokens: int


CPU_LIMITS = BatchLimits(max_num_seqs=64, max_num_batched_tokens=2048)
CUDA_LIMITS = BatchLimits(max_num_seqs=256, max_num_batched_tokens=8192)
CUDA_SERVE_LIMITS = BatchLimits(max_num_seqs=256, max_num_batched_tokens=2048)


def default_limits(device_type: str, task: str) -> BatchLimits:
    """The limits a null key takes on ``device_type`` (resolved: cpu or cuda) for ``task``."""
    if device_type != "cuda":
        return CPU_LIMITS
    return CUDA_SERVE_LIMITS if task == "serve" else CUDA_LIMITS


def resolve_batch_limits(
    sched: SchedulerConfig, device_type: str, task: str, max_model_len: int
) -> tuple[SchedulerConfig, list[str]]:
    """A copy of ``sched`` with its null limits set to the device's, and the keys that were null.
    Without chunked prefill a null token budget also covers ``max_model_len`` (a whole prompt a step)."""
    defaults = default_limits(device_type, task)
    filled = {
        key: getattr(defaults, key) for key in ("max_num_seqs", "max_num_batched_tokens") if getattr(sched, key) is None
    }
    if "max_num_batched_tokens" in filled and not sched.enable_chunked_prefill:
        filled["max_num_batched_tokens"] = max(filled["max_num_batched_tokens"], max_model_len)
    return replace(sched, **filled), [f"scheduler.{key}" for key in filled]


def resolve_async_scheduling(
    requested: bool | None, *, tp: int, pp: int, dp: int, speculative_method: str | None, device_type: str
) -> bool:
    """Overlap pays where the device runs apart from the host: CUDA, one worker in this process.
    Pipeline stages and data-parallel replicas step synchronously; so does speculative decoding
    (``speculative_method`` not None), which needs each step's accepted tokens before it schedules
    the next. ``tp``, ``pp`` and ``dp`` are the ``parallel`` sizes; ``device_type`` is resolved."""
    if pp > 1 or dp > 1:
        if requested:
            raise ValueError("scheduler.async_scheduling=true: not supported with parallel.pp > 1 or parallel.dp > 1")
        return False
    if speculative_method is not None:
        if requested:
            raise ValueError(
                f"scheduler.async_scheduling=true: not supported with speculative.method={speculative_method} "
                "(speculation schedules each step after the previous one's accepted tokens); set it to false or null"
            )
        return False
    if requested is None:
        return device_type == "cuda" and tp * pp == 1
    return requested
