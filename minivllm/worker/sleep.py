"""Sleep mode: a worker gives back its device memory between rollouts, and takes it again.

``Worker.sleep(level)`` and ``Worker.wake_up(tags)`` (``model.enable_sleep_mode``) keep
their state here::

    level 1   KV cache freed; weights copied to host memory (on CUDA: pinned), device copies freed
    level 2   KV cache freed; weights discarded (the caller loads new ones after waking)
    wake_up   tags "weights" and/or "kv_cache" (both when None): weights copied back
              (level 1) or re-allocated uninitialised (level 2); the KV cache allocated again,
              zeroed, with the same number of blocks

The engine never sleeps with requests running, and forgets its prefix cache first (the
KV it indexes is gone). Freed memory goes back to the device allocator's owner:
``torch.cuda.empty_cache()`` on CUDA, ``malloc_trim`` on the CPU (glibc keeps freed
heap pages otherwise, and the process's resident set would not shrink).

On the CPU the weights already live in host memory, so level 1 keeps them where they
are and frees only the KV cache; level 2 frees them too.

CUDA graphs read the KV cache and the weights at the addresses they were captured
with. Waking allocates both anew (the caching allocator may hand out other addresses),
so the graphs are dropped when the worker sleeps and captured again once both the
weights and the KV cache are awake.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass, field

import torch
from torch import nn

TAGS = ("weights", "kv_cache")


@dataclass
class SleepState:
    """What a sleeping worker put away; empty ``asleep`` while awake."""

    asleep: set[str] = field(default_factory=set)
    level: int = 0
    host_weights: dict[str, torch.Tensor] = field(default_factory=dict)
    """Level 1 on CUDA: each parameter's host copy, by name."""
    shapes: dict[str, tuple[torch.Size, torch.dtype]] = field(default_factory=dict)
    """Each freed parameter's shape and dtype (to re-allocate it)."""


def check_tags(tags: list[str] | tuple[str, ...] | None) -> list[str]:
    """The tags to wake (both when None); ValueError naming a tag that is not one of ``TAGS``."""
    if tags is None:
        return list(TAGS)
    if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
        raise ValueError(f"wake_up: tags={tags!r} must be a list of {', '.join(TAGS)} (or None for all)")
    bad = [t for t in tags if t not in TAGS]
    if bad:
        raise ValueError(f"wake_up: tags={tags!r}: unknown {', '.join(bad)}; allowed: {', '.join(TAGS)}")
    return list(tags)


def check_level(level: int) -> None:
    if level not in (1, 2) or isinstance(level, bool):
        raise ValueError(f"sleep: level={level!r} must be 1 (offload weights, free KV) or 2 (discard both)")


@torch.no_grad()
def put_weights_away(model: nn.Module, level: int, state: SleepState) -> None:
    """Free the device copies of every parameter: kept on the host at level 1, dropped at level 2.
    Level 1 on the CPU changes nothing (the weights are in host memory already)."""
    for name, param in model.named_parameters():
        device = param.device
        if level == 1 and device.type == "cpu":
            continue
        state.shapes[name] = (param.shape, param.dtype)
        if level == 1:
            host = torch.empty(param.shape, dtype=param.dtype, pin_memory=torch.cuda.is_available())
            state.host_weights[name] = host.copy_(param.data)
        param.data = torch.empty(0, dtype=param.dtype, device=device)
    if level == 2:  # the CPU's oneDNN copies of the weights (device.cpu_packed_linear) go too
        for module in model.modules():
            if getattr(module, "cpu_packed_weight", None) is not None:
                module.cpu_packed_weight = None


@torch.no_grad()
def bring_weights_back(model: nn.Module, device: torch.device, state: SleepState) -> None:
    """The parameters freed by ``put_weights_away`` again: their host copies, or uninitialised memory."""
    for name, param in model.named_parameters():
        if name not in state.shapes:
            continue
        shape, dtype = state.shapes.pop(name)
        host = state.host_weights.pop(name, None)
        param.data = host.to(device) if host is not None else torch.empty(shape, dtype=dtype, device=device)


def weight_bytes(model: nn.Module) -> int:
    """Bytes held by the model's parameter storages (0 for freed ones)."""
    return sum(p.untyped_storage().nbytes() for p in model.parameters())


def release_freed_memory(device: torch.device) -> None:
    """Give memory freed by torch back to where it came from, so that it shows as free."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        return
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    libc = ctypes.CDLL(libc_name)
    trim = getattr(libc, "malloc_trim", None)  # glibc only
    if trim is not None:
        trim(0)
