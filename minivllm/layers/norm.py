"""Normalisation layers; statistics are computed in fp32 whatever the model dtype.

On CUDA, ``RMSNorm`` and ``GemmaRMSNorm`` run as one Triton kernel
(``layers.ops.fused_rms_norm``), fused with the residual add where there is one; the torch code below is the
reference and the CPU path. On the CPU, fp32 inputs take
``torch.rms_norm``, which gives the reference's bits in one call from Python (on
the CPU it still runs the same few elementwise ops inside). Where the CPU's C kernels build
(``layers/ops/cpu_fused.py``), the plain fp32 norm runs as one of them instead, fused with the residual
add and in place like the Triton kernel (fp32 rounding apart from torch's arithmetic).
A further subclass that changes the arithmetic (a different ``_norm``) keeps the torch path.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.layers.ops import cpu_fused


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.is_plain = type(self)._norm is RMSNorm._norm
        """Llama's arithmetic (a subclass with its own ``_norm`` keeps it on every path)."""
        self.use_triton = self.is_plain or type(self)._norm is GemmaRMSNorm._norm
        """Whether CUDA inputs take the fused Triton kernel (off under torch.compile)."""
        self.use_cpu_kernel = self.is_plain
        """Whether fp32 CPU inputs take the C kernel (``layers/ops/cpu_fused.py``; off under torch.compile)."""

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """With ``residual``: returns (norm(x + residual), x + residual), the fused
        add-and-norm that pre-norm decoder layers use between sublayers."""
        if self.use_triton and x.is_cuda:
            return self._forward_triton(x, residual)
        if self.use_cpu_kernel and x.dtype == torch.float32 and x.device.type == "cpu" and cpu_fused.load():
            out = self._forward_cpu_kernel(x, residual)
            if out is not None:
                return out
        norm = self._norm
        if self.is_plain and x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            norm = self._norm_fp32
        if residual is None:
            return norm(x)
        summed = x + residual
        return norm(summed), summed

    def _norm_fp32(self, x: torch.Tensor) -> torch.Tensor:
        """``_norm`` as one torch call: in fp32 it gives the same bits (the
        tests check it) with one call from Python instead of seven."""
        return torch.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def _forward_cpu_kernel(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
        """``forward`` by the C kernel, updating ``x`` and ``residual`` in place like ``_forward_triton``;
        None where it does not serve these tensors (an fp32 weight and rows of contiguous features)."""
        if self.weight.dtype != torch.float32:
            return None
        if residual is None:
            if not x.is_contiguous():
                return None
            return cpu_fused.add_rms_norm_(x.view(-1, x.shape[-1]), self.weight, self.eps).view(x.shape)
        if not (cpu_fused.rows_ok(x) and cpu_fused.rows_ok(residual)):
            return None
        return cpu_fused.add_rms_norm_(x, self.weight, self.eps, residual), residual

    def _forward_triton(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without a residual the input is left intact (callers keep it as the residual);
        with one, ``x`` and ``residual`` are the sublayer's fresh output and the running
        sum, owned by the caller's forward, so both are updated in place."""
        from minivllm.layers.ops.fused_rms_norm import rms_norm_

        shape, gemma = x.shape, not self.is_plain
        if residual is None:
            out = x.reshape(-1, shape[-1]).clone()
            rms_norm_(out, self.weight, self.eps, gemma=gemma)
            return out.view(shape)
        if not (x.is_contiguous() and residual.is_contiguous()):
            x, residual = x.contiguous(), residual.contiguous()
        flat_x, flat_r = x.view(-1, shape[-1]), residual.view(-1, shape[-1])
        rms_norm_(flat_x, self.weight, self.eps, flat_r, gemma=gemma)
        return x, residual


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm: scales by ``1 + weight`` (weights are stored zero-centred),
    multiplied in fp32 before casting back."""

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` whose parameters load from checkpoints like ours do."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, bias: bool = True, affine: bool = True) -> None:
        super().__init__(hidden_size, eps=eps, elementwise_affine=affine, bias=bias)
        for p in self.parameters():
            p.requires_grad_(False)
