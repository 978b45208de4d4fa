"""The groups that say how the model is loaded and run: ``load``, ``compilation``,
``attention`` and ``device``.

Each names a choice (a weight format, a backend, a device) that ``auto`` leaves to
``VllmConfig`` to resolve from the checkpoint and the machine (``resolve.py``);
the classes they pick are ``_target_`` nodes a user may point at their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from minivllm.config.validation import check_choice, check_range

LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy", "gguf", "tensorizer", "sharded_state")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
DEVICE_TYPES = ("auto", "cpu", "cuda")


@dataclass
class LoadConfig:
    """How weights are read."""

    format: str = "auto"
    """Weights: auto (safetensors, else .bin/.pt), safetensors, pt, dummy (random), gguf, tensorizer, sharded_state."""
    loader: Any = None
    """``_target_`` node of the model loader; null follows ``format``."""
    use_tqdm: bool = True
    """Show a progress bar while loading weight files (only on a terminal)."""
    download_dir: Optional[str] = None
    """HF cache directory to find hub checkpoints in; defaults to the HF cache."""

    def __post_init__(self) -> None:
        check_choice("load.format", self.format, LOAD_FORMATS)


@dataclass
class CompilationConfig:
    """CUDA graphs and torch.compile (GPU only; ignored on the CPU)."""

    cudagraph: bool = True
    """Capture CUDA graphs for decode-only steps (CUDA only; ignored on the CPU)."""
    cudagraph_capture_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
    """Batch sizes captured as CUDA graphs; other sizes pad up to the next one."""
    torch_compile: Optional[bool] = None
    """Compile the small elementwise ops (norms, rotary, gated activations) with torch.compile instead of
    running the Triton kernels and eager torch. null: on for CUDA (8% faster decode steps on an H200,
    benchmarks/RESULTS.md), off on the CPU (nothing measured to gain there; it adds start-up)."""
    max_seq_len_to_capture: int = 8192
    """Decode steps with a sequence longer than this run eagerly instead of replaying a CUDA graph."""

    def __post_init__(self) -> None:
        for size in self.cudagraph_capture_sizes:
            check_range("compilation.cudagraph_capture_sizes[]", size, low=1)
        check_range("compilation.max_seq_len_to_capture", self.max_seq_len_to_capture, low=1)


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


@dataclass
class DeviceConfig:
    """Where the model runs."""

    type: str = "auto"
    """auto (cuda when available, else cpu), cpu or cuda."""

    def __post_init__(self) -> None:
        check_choice("device.type", self.type, DEVICE_TYPES)
