"""What a tile choice needs to know of the device a kernel launches on."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceFacts:
    name: str
    """``torch.cuda.get_device_name``: the tuned tables' key ("cpu" for the interpreter)."""
    arch: int | None
    """Compute capability as one number (80: sm_80); None off CUDA."""
    num_sms: int
    """Streaming multiprocessors: the number of programs one wave runs."""


CPU = DeviceFacts("cpu", None, 1)


@functools.lru_cache(maxsize=None)
def _cuda_facts(index: int) -> DeviceFacts:
    major, minor = torch.cuda.get_device_capability(index)
    props = torch.cuda.get_device_properties(index)
    return DeviceFacts(torch.cuda.get_device_name(index), 10 * major + minor, props.multi_processor_count)


def device_facts(device: torch.device) -> DeviceFacts:
    """The facts of ``device``, read once per CUDA device (no synchronisation after the first)."""
    if device.type != "cuda":
        return CPU
    return _cuda_facts(device.index if device.index is not None else torch.cuda.current_device())
