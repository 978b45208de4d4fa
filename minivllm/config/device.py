"""How the model runs on its device: the ``device``, ``attention`` and ``compilation`` groups.

Each names a choice (a device, an attention backend, CUDA graphs and torch.compile)
that ``auto`` or null leaves to ``VllmConfig`` to resolve from the machine, with the
functions here; the backend class is a ``_target_`` node a user may point at their own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
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
    when set, else the cores of the process's affinity mask (os.sched_getaffinity), shared among local ranks.
    Processes minivllm spawns on the CPU start with OMP_WAIT_POLICY=PASSIVE unless it is set; an engine in
    your own process reads yours (set it to PASSIVE on a shared machine, benchmarks/RESULTS.md)."""

    cpu_packed_linear: Optional[bool] = None
    """CPU: run the unquantized linear layers and the LM head on weights packed once at load, a second
    copy of those weights: fp32 into column panels for minivllm's C GEMM (quantization/cpu_panel_gemm.py:
    1.4-1.5x oneDNN at 8-32 rows, level at prefill), bf16 reordered for oneDNN's matmul (about 2x
    torch's GEMM, benchmarks/RESULTS.md). null: on for device=cpu where torch has oneDNN and the model
    dtype is float32 (or bfloat16 where oneDNN runs it natively), for layers of 512 x 512 weights or more;
    true: every layer, refused where it cannot run. In fp32 one row (a single request's decode) runs a C
    kernel on the plain weight instead, which is moved into huge-page-advised memory at load."""

    cpu_fused_decode: Optional[bool] = None
    """CPU: run a plain Llama decoder stack (Llama, and the families built of its layers unchanged) as
    one C call for each decode-only step, calling the same kernels the layers call one by one
    (models/llama_cpu_decode.py: ~1.3 ms less Python a step on a 12-layer model). A step of one
    request runs on the plain weights; a step of several on the packed ones (device.cpu_packed_linear:
    layers below its size run their modules in such steps). null: on for device=cpu with a float32
    model and KV cache, without LoRA or speculative decoding, where the model's layers qualify; true:
    refused where they do not, with the reason; false: off."""

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


CPU_PACK_MIN_WEIGHTS = 1 << 18
"""``device.cpu_packed_linear=null`` packs the layers of at least this many weights (512 x 512): a oneDNN
call costs ~9 us more than F.linear's (1.5 us for a 32 x 64 layer at one row), which a smaller layer
does not earn back; ``true`` packs every layer."""


def resolve_cpu_packed_linear(requested: bool | None, device_type: str, dtype: torch.dtype) -> bool:
    """``device.cpu_packed_linear``: null is on where it can run (the CPU, torch built with oneDNN, an
    fp32 model or a bf16 one on a CPU with native bf16); true where it cannot is an error naming why."""
    why = None
    if device_type != "cpu":
        why = f"it packs CPU weights; the device is {device_type}"
    elif not torch.backends.mkldnn.is_available():
        why = "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    elif dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        why = "this CPU has no native bf16 for oneDNN (AVX512-BF16 / AMX); use model.dtype=float32"
    elif dtype not in (torch.float32, torch.bfloat16):
        why = f"oneDNN's packed CPU matmul takes float32 or bfloat16 weights, not {str(dtype).removeprefix('torch.')}"
    if requested is None:
        return why is None
    if requested and why is not None:
        raise ValueError(f"device.cpu_packed_linear=true: {why}; use null or false")
    return requested


def resolve_cpu_fused_decode(
    requested: bool | None, device_type: str, dtype: torch.dtype, refused_with: dict[str, bool]
) -> bool:
    """``device.cpu_fused_decode``: null is on for an fp32 model on the CPU without any of
    ``refused_with`` (option -> set); true where it cannot run is an error naming why. Whether the
    model's layers qualify is decided at load (``models/llama_cpu_decode.py:attach``)."""
    why = None
    if device_type != "cpu":
        why = f"it runs the CPU's C kernels; the device is {device_type}"
    elif dtype != torch.float32:
        why = f"its kernels take float32 weights, not {str(dtype).removeprefix('torch.')}"
    else:
        why = next((f"not with {option}" for option, on in refused_with.items() if on), None)
    if requested is None:
        return why is None
    if requested and why is not None:
        raise ValueError(f"device.cpu_fused_decode=true: {why}; use null or false")
    return requested


def attention_target(name: str, device_type: str) -> str:
    if name == "auto":
        name = "triton" if device_type == "cuda" else "torch"
    return ATTENTION_TARGETS[name]


@dataclass
class CompilationConfig:
    """CUDA graphs (GPU only; ignored on the CPU), torch.compile (either device) and the fused sampler."""

    cudagraph: bool = True
    """Capture CUDA graphs for decode-only steps (CUDA only; ignored on the CPU)."""
    cudagraph_capture_sizes: Optional[list[int]] = None
    """Batch sizes captured as CUDA graphs; other sizes pad up to the next one (null: 1, 2, 4, then every
    multiple of 8 up to scheduler.max_num_seqs, and max_num_seqs itself, as vLLM captures)."""
    torch_compile: Optional[bool] = None
    """Compile the small elementwise ops (norms, rotary, gated activations) with torch.compile instead of
    running the Triton kernels and eager torch. null: on for CUDA (8% faster decode steps on an H200,
    benchmarks/RESULTS.md), off on the CPU (inductor's C++ gained ~4% CPU time on a 768-hidden Llama, for
    14-65 s of start-up: benchmarks/RESULTS.md); compiled kernels are cached under minivllm's cache folder."""
    max_seq_len_to_capture: int = 8192
    """Decode steps with a sequence longer than this run eagerly instead of replaying a CUDA graph."""
    fused_sampler: Optional[bool] = None
    """Sample with one fused Triton pass over the logits instead of the torch ops (docs/sampling.md).
    null: on for CUDA, off on the CPU, where true needs TRITON_INTERPRET=1 (Triton's interpreter: slow)."""

    def __post_init__(self) -> None:
        for size in self.cudagraph_capture_sizes or ():
            check_range("compilation.cudagraph_capture_sizes[]", size, low=1)
        check_range("compilation.max_seq_len_to_capture", self.max_seq_len_to_capture, low=1)


def capture_sizes(requested: list[int] | None, max_num_seqs: int) -> list[int]:
    """The batch sizes captured as CUDA graphs, ascending, none above ``max_num_seqs``.

    ``compilation.cudagraph_capture_sizes``: an explicit list wins (its sizes past
    ``max_num_seqs`` dropped). Null follows vLLM: 1, 2, 4, then every multiple of 8, and
    ``max_num_seqs`` itself, so a decode step of ``B`` requests pads to at most ``B + 7``
    rows (under 5% padding over a batch shrinking from 256, ``benchmarks/graph_padding.py``)."""
    if requested is not None:
        return sorted({s for s in requested if s <= max_num_seqs})
    sizes = {s for s in (1, 2, 4) if s <= max_num_seqs} | set(range(8, max_num_seqs + 1, 8)) | {max_num_seqs}
    return sorted(sizes)


def resolve_fused_sampler(requested: bool | None, device_type: str) -> bool:
    """``compilation.fused_sampler``: null follows the device (on for CUDA, off on the CPU). On the
    CPU the kernel runs only in Triton's interpreter, which must be on before Triton is imported."""
    if requested is None:
        return device_type == "cuda"
    if requested and device_type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "compilation.fused_sampler=true on the CPU needs TRITON_INTERPRET=1 in the environment "
            "(the kernel runs in Triton's interpreter there); use null or false"
        )
    return requested


def resolve_torch_compile(requested: bool | None, device_type: str) -> bool:
    """``compilation.torch_compile``: null follows the device (on for CUDA, where it was measured
    faster, off on the CPU)."""
    return device_type == "cuda" if requested is None else requested
