"""Peak memory of a benchmark run, on the device it ran on.

CUDA: the allocator's high-water mark. CPU: the process's resident high-water mark
(``VmHWM``), reset at the start where Linux allows it (``/proc/self/clear_refs``),
so each job of a multirun reports its own peak rather than the process's.
"""

from __future__ import annotations

import resource
from pathlib import Path

import torch

GiB = float(1 << 30)


class PeakMemory:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        else:
            _reset_cpu_peak()

    def read_gib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / GiB
        return _cpu_peak_bytes() / GiB


def _reset_cpu_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # not Linux, or not allowed: the lifetime peak is reported instead


def _cpu_peak_bytes() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
