"""The bandwidth floor of a workload: the least time it could take if every step
only had to stream its bytes through memory once.

Decoding small batches is memory-bound: each step reads every weight once and
the KV cache of every scheduled token's context::

    floor = sum over steps (weight bytes + kv tokens read x kv bytes per token) / bandwidth

``bandwidth`` is measured here with a large device-to-device copy (read + write).
``achieved_fraction = floor / measured time``: 1.0 would be perfect streaming.
Compute-bound prefill steps make the floor loose, so the fraction is a lower bound
on how well the decode steps use memory bandwidth.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from minivllm.bench.step_timer import StepRecord


def measure_copy_bandwidth(device: torch.device, num_bytes: int = 256 << 20, repeats: int = 5) -> float:
    """Bytes per second moved by ``dst.copy_(src)`` on ``device`` (each byte read once and written once)."""
    n = num_bytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch / warm-up
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    del src, dst
    return 2 * n * 4 / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of distinct parameters (tied weights counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def kv_bytes_per_token(kv_caches: list[torch.Tensor]) -> int:
    """Bytes of keys + values one token occupies across all layers: each cache is
    (2, num_blocks, block_size, kv_heads, head_dim)."""
    return sum(2 * c.shape[-2] * c.shape[-1] * c.element_size() for c in kv_caches)


def roofline(steps: list[StepRecord], model_runner: Any, device: torch.device, measured_s: float) -> dict[str, Any]:
    """The floor of the recorded steps and the fraction of it the run achieved."""
    bandwidth = measure_copy_bandwidth(device)
    w_bytes = weight_bytes(model_runner.model)
    kv_token = kv_bytes_per_token(model_runner.kv_caches)
    bytes_moved = sum(w_bytes + s.kv_tokens * kv_token for s in steps if s.num_tokens)
    floor_s = bytes_moved / bandwidth
    decode = [s for s in steps if s.decode_only]
    decode_bytes = sum(w_bytes + s.kv_tokens * kv_token for s in decode)
    decode_s = sum(s.wall_s for s in decode)
    return {
        "device": str(device),
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "weight_bytes": w_bytes,
        "kv_bytes_per_token": kv_token,
        "bytes_moved": bytes_moved,
        "floor_s": floor_s,
        "measured_s": measured_s,
        "achieved_fraction": floor_s / measured_s if measured_s > 0 else None,
        "decode_achieved_fraction": (decode_bytes / bandwidth) / decode_s if decode_s > 0 else None,
    }
