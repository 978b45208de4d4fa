"""Normalisation layers; statistics are computed in fp32 whatever the model dtype."""
from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """With ``residual``: returns (norm(x + residual), x + residual), the fused
        add-and-norm that pre-norm decoder layers use between sublayers."""
        if residual is None:
            return self._norm(x)
        summed = x + residual
        return self._norm(summed), summed


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
