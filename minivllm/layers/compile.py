"""``compilation.torch_compile``: fuse the small elementwise ops with torch.compile.

Norms, rotary embeddings and gated activations are chains of tiny kernels in
eager mode; compiled, each becomes one fused kernel. Matmuls and attention are
left alone (they already are single, tuned kernels). Compilation happens on the
first call of each shape family (``dynamic=True``), i.e. during the profile run.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.layers.activation import ActAndMul
from minivllm.layers.norm import RMSNorm
from minivllm.layers.rotary import RotaryEmbedding

FUSABLE = (RMSNorm, ActAndMul, RotaryEmbedding)


def compile_small_ops(model: nn.Module) -> int:
    """Replace the forward of every fusable module with a compiled one; returns how many."""
    compiled = {}
    count = 0
    for module in model.modules():
        if isinstance(module, FUSABLE):
            cls = type(module)
            if cls not in compiled:  # one compiled function per class, shared by its instances
                compiled[cls] = torch.compile(cls.forward, dynamic=True)
            module.forward = compiled[cls].__get__(module, cls)
            if hasattr(module, "use_triton"):
                module.use_triton = False  # the compiled torch code replaces the Triton kernel
            if hasattr(module, "use_cpu_kernel"):
                module.use_cpu_kernel = False  # and the CPU's C kernel
            count += 1
    return count
