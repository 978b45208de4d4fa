"""Where a profiled step's device time goes: kernels grouped into attention,
GEMM, sampler, small ops and copies.

A kernel is a sampler kernel when the CPU op that launched it ran inside the
``SAMPLER_RANGE`` ``record_function`` range (the profiling script wraps the
sampler in it); otherwise its name decides::

    attention   the paged-attention, split-combine and KV-write kernels (any *attn*/*attention*)
    gemm        cuBLAS / CUTLASS / nvjet matrix products, Triton GEMMs, aten::mm on the CPU
    copies      Memcpy / Memset
    small ops   everything else: norms, rotary, activations, elementwise, reductions

Kernels of a replayed CUDA graph are launched by no CPU op; they are counted
from the device's own records and grouped by name.
On the CPU (no device kernels) the ops' own CPU time stands in for kernel time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable

SAMPLER_RANGE = "minivllm::sampler"
GROUPS = ("attention", "gemm", "sampler", "small ops", "copies")
_ATTENTION = ("attention", "attn", "combine_splits", "write_kv", "flash", "sdpa", "reshape_and_cache")
_GEMM = (
    "gemm",
    "matmul",
    "cutlass",
    "cublas",
    "nvjet",
    "xmma",
    "gemv",
    "splitk",
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
)


@dataclass(frozen=True, slots=True)
class KernelTime:
    name: str
    us: float
    in_sampler: bool = False


def group_of(kernel: KernelTime) -> str:
    if kernel.in_sampler:
        return "sampler"
    name = kernel.name.lower()
    if name.startswith(("memcpy", "memset")):
        return "copies"
    if any(p in name for p in _ATTENTION):
        return "attention"
    if any(p in name for p in _GEMM):
        return "gemm"
    return "small ops"


def _inside(event: Any, range_name: str) -> bool:
    parent = event
    while parent is not None:
        if parent.name == range_name:
            return True
        parent = getattr(parent, "cpu_parent", None)
    return False


def _is_device(event: Any) -> bool:
    return "CPU" not in str(getattr(event, "device_type", "CPU"))


def _is_annotation(event: Any) -> bool:
    return bool(getattr(event, "is_user_annotation", False)) or event.name.startswith(("minivllm::", "ProfilerStep"))


def device_kernels(events: Iterable[Any]) -> list[KernelTime]:
    """Kernels of a CUDA profile: those a CPU op launched (sampler or not by its range),
    plus the device's records that no CPU op claims (CUDA graph replays)."""
    events = list(events)
    kernels: list[KernelTime] = []
    claimed: dict[str, float] = defaultdict(float)
    for e in events:
        if _is_device(e) or not getattr(e, "kernels", None):
            continue
        in_sampler = _inside(e, SAMPLER_RANGE)
        for k in e.kernels:
            if k.name.startswith(("minivllm::", "ProfilerStep")):
                continue
            kernels.append(KernelTime(k.name, float(k.duration), in_sampler))
            claimed[k.name] += float(k.duration)
    on_device: dict[str, float] = defaultdict(float)
    for e in events:
        if _is_device(e) and not _is_annotation(e):
            on_device[e.name] += float(e.time_range.elapsed_us())
    for name, us in on_device.items():
        if us - claimed[name] > 0.5:
            kernels.append(KernelTime(name, us - claimed[name]))
    return kernels


CPU_KERNEL_RANGES = ("cpu_paged_decode_attention",)
"""Ranges around the engine's own CPU kernels (called outside aten, so only their range shows)."""


def cpu_ops(events: Iterable[Any]) -> list[KernelTime]:
    """The CPU's stand-in for kernels: each aten op's self time, and the engine's own CPU kernels'."""
    return [
        KernelTime(e.name, float(e.self_cpu_time_total), _inside(e, SAMPLER_RANGE))
        for e in events
        if (e.name.startswith("aten::") or e.name in CPU_KERNEL_RANGES) and e.self_cpu_time_total > 0
    ]


def summarize(kernels: list[KernelTime], steps: int, top: int = 15) -> dict[str, Any]:
    """Per-step milliseconds and shares by group, and the ``top`` kernels by time."""
    total = sum(k.us for k in kernels) or 1.0
    by_group: dict[str, float] = {g: 0.0 for g in GROUPS}
    by_name: dict[tuple[str, str], list[float]] = defaultdict(list)
    for k in kernels:
        by_group[group_of(k)] += k.us
        by_name[(k.name, group_of(k))].append(k.us)
    ranked = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:top]
    return {
        "kernel_ms_per_step": total / 1e3 / steps,
        "groups": {g: {"ms_per_step": us / 1e3 / steps, "percent": 100 * us / total} for g, us in by_group.items()},
        "top": [
            {
                "name": name,
                "group": group,
                "ms_per_step": sum(t) / 1e3 / steps,
                "calls_per_step": len(t) / steps,
                "percent": 100 * sum(t) / total,
            }
            for (name, group), t in ranked
        ],
    }


def format_summary(summary: dict[str, Any], width: int = 70) -> str:
    lines = [f"{'group':12}{'ms/step':>10}{'%':>7}"]
    lines += [f"{g:12}{v['ms_per_step']:>10.3f}{v['percent']:>7.1f}" for g, v in summary["groups"].items()]
    lines.append(f"\n{'kernel':{width}}  {'group':10}{'ms/step':>9}{'calls':>7}{'%':>7}")
    for k in summary["top"]:
        name = k["name"] if len(k["name"]) <= width else k["name"][: width - 3] + "..."
        lines.append(
            f"{name:{width}}  {k['group']:10}{k['ms_per_step']:>9.3f}{k['calls_per_step']:>7.1f}{k['percent']:>7.1f}"
        )
    return "\n".join(lines)
