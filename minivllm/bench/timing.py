"""Timing one kernel call for the kernel benchmarks (``benchmarks/attention.py``, ``moe.py``, ``quant_gemm.py``)."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

Timer = Callable[[Callable[[], object]], float]


def kernel_timer(device: torch.device, cpu_clock: Callable[[], float] = time.process_time, runs: int = 3) -> Timer:
    """fn -> median seconds per call: Triton's ``do_bench`` on CUDA (after its own warm-up);
    on the CPU, one warm-up call then the median of ``runs`` calls on ``cpu_clock`` (process
    time by default: with one intra-op thread it is the compute time, and other jobs on a
    shared machine do not inflate it as they inflate wall-clock time)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, return_mode="median") * 1e-3

    def on_the_cpu(fn: Callable[[], object]) -> float:
        fn()
        times = []
        for _ in range(runs):
            start = cpu_clock()
            fn()
            times.append(cpu_clock() - start)
        return statistics.median(times)

    return on_the_cpu
