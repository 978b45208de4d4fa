"""How the model runs on its device: the ``device``, ``attention`` and ``compilation`` groups.

Each names a choice (a device, an attention backend, CUDA graphs and torch.compile)
that ``auto`` or null leaves to ``VllmConfig`` to resolve from the machine, with the
functions here; the backend class is a ``_target_`` node a user may point at their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from minivllm.config.model import check_choice, check_range

DEVICE_TYPES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
ATTENTION_TARGETS = {
    "torch": "minivllm.attention.torch_backend.TorchAttentionBackend",
    "triton": "minivllm.attention.triton_backend.TritonAttentionBackend",
}


@dataclass
class DeviceConfig:
    """Where the model runs."""

    type: str = "auto"
    """auto (cuda when available, else cpu), cpu or cuda."""
    cpu_threads: Optional[int] = None
    """Intra-op threads of each CPU worker (torch's and the CPU attention kernel's). null: OMP_NUM_THREADS
    when set, else the cores of the process's affinity mask (os.sched_getaffinity), shared among local ranks."""

    def __post_init__(self) -> None:
        check_choice("device.type", self.type, DEVICE_TYPES)
        if self.cpu_threads is not None:
            check_range("device.cpu_threads", self.cpu_threads, low=1)


def resolve_device(device_type: str) -> str:
    if device_type == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device.type=cuda: no CUDA device is visible; use device=cpu or device=auto")
    return device_type


@dataclass
class AttentionConfig:
    """The attention backend."""

    name: str = "auto"
    """Backend: auto (triton on CUDA, torch on CPU), torch, triton, or custom (with a backend node)."""
    backend: Any = None
    """``_target_`` node of the backend class; null follows ``name``."""

    def __post_init__(self) -> None:
        check_choice("attention.name", self.name, ATTENTION_BACKENDS + ("custom",))
        if self.name == "custom" and not self.backend:
            raise ValueError("attention.name=custom: needs attention.backend._target_ (your backend class)")


def attention_target(name: str, device_type: str) -> str:
    if name == "auto":
        name = "triton" if device_type == "cuda" else "torch"
    return ATTENTION_TARGETS[name]


@dataclass
class CompilationConfig:
    """CUDA graphs (GPU only; ignored on the CPU) and torch.compile (either device)."""

    cudagraph: bool = True
    """Capture CUDA graphs for decode-only steps (CUDA only; ignored on the CPU)."""
    cudagraph_capture_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
    """Batch sizes captured as CUDA graphs; other sizes pad up to the next one."""
    torch_compile: Optional[bool] = None
    """Compile the small elementwise ops (norms, rotary, gated activations) with torch.compile instead of
    running the Triton kernels and eager torch. null: on for CUDA (8% faster decode steps on an H200,
    benchmarks/RESULTS.md), off on the CPU (inductor's C++ gained ~4% CPU time on a 768-hidden Llama, for
    14-65 s of start-up: benchmarks/RESULTS.md); compiled kernels are cached under minivllm's cache folder."""
    max_seq_len_to_capture: int = 8192
    """Decode steps with a sequence longer than this run eagerly instead of replaying a CUDA graph."""

    def __post_init__(self) -> None:
        for size in self.cudagraph_capture_sizes:
            check_range("compilation.cudagraph_capture_sizes[]", size, low=1)
        check_range("compilation.max_seq_len_to_capture", self.max_seq_len_to_capture, low=1)


def resolve_torch_compile(requested: bool | None, device_type: str) -> bool:
    """``compilation.torch_compile``: null follows the device (on for CUDA, where it was measured
    faster, off on the CPU)."""
    return device_type == "cuda" if requested is None else requested
