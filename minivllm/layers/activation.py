"""Activation functions by their config.json names."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.layers.ops import cpu_fused

_ACTS = {
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}


def get_act_fn(name: str):
    if name not in _ACTS:
        raise ValueError(f"activation {name!r}: supported are {', '.join(sorted(_ACTS))}")
    return _ACTS[name]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """(N, 2I) ``[gate | up]`` -> (N, I) ``silu(gate) * up``."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """(n, 2I) [gate; up] -> (n, I): gpt-oss's SwiGLU, with the gate clamped above and up on both sides."""
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * gate * torch.sigmoid(gate * alpha)


class ActAndMul(nn.Module):
    """``act(gate) * up`` on the fused ``[gate | up]`` output of a gate_up projection.

    On CUDA, SiLU runs as one Triton kernel (``layers.ops.silu_and_mul``), on the CPU in fp32 as one
    C kernel where it builds (``layers/ops/cpu_fused.py``); the torch code is the reference."""

    def __init__(self, act: str = "silu") -> None:
        super().__init__()
        self.act = get_act_fn(act)
        self.use_triton = act in ("silu", "swish")
        """Whether CUDA inputs take the fused Triton kernel (off under torch.compile)."""
        self.use_cpu_kernel = self.use_triton
        """Whether fp32 CPU inputs take the C kernel (off under torch.compile)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, 2I) -> (T, I)
        if self.use_triton and x.is_cuda and x.dim() == 2:
            from minivllm.layers.ops.silu_and_mul import silu_and_mul as fused

            return fused(x)
        if self.use_cpu_kernel and x.dtype == torch.float32 and cpu_fused.rows_ok(x) and cpu_fused.load():
            return cpu_fused.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return self.act(gate).mul_(up)  # the activation's output is fresh: multiplied in place
