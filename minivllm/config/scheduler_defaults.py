"""The device's batch limits: what ``scheduler.max_num_seqs`` and
``scheduler.max_num_batched_tokens`` mean when they are null.

On the CPU a step of 64 requests and 2,048 tokens is already long, so those stay.
On CUDA the limits follow vLLM's defaults for a GPU it does not single out
(its larger values need the device's memory and name, a query that would start a
CUDA context in the process that builds the config, before any worker runs):
256 requests, and 8,192 tokens a step offline (``LLM``, task=generate, task=bench)
but 2,048 for task=serve, where a shorter prefill step keeps decode latency low.
256 is within the largest default CUDA graph (``compilation.cudagraph_capture_sizes``
ends at 512), so every decode batch replays a captured graph, and the token budget
is what the worker's profile run measures before it sizes the KV cache.
With chunked prefill off, a null token budget is at least ``max_model_len`` (as in
vLLM), so that every prompt the context length admits can be scheduled in one step.
Explicit values always win; ``VllmConfig`` resolves them once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from minivllm.config.scheduler_config import SchedulerConfig


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
