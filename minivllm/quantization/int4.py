"""4-bit weights with per-group scales and zero points, shared by AWQ and GPTQ.

Both formats are converted after loading into one layout, which the torch
reference and the Triton kernel both read:

    qweight (K // 8, N) int32   eight consecutive input rows per int32, row k in
                                bits 4*(k % 8) .. 4*(k % 8) + 3
    scales  (G, N)              model dtype
    zeros   (G, N) uint8        the zero point itself (0..16)
    g_idx   (K,) int32          the group of each input row

and the real weight is ``W[k, n] = (q[k, n] - zeros[g_idx[k], n]) * scales[g_idx[k], n]``,
``y = x @ W`` (K = local input features, N = local output features).

Contiguous groups (AWQ, GPTQ without act-order: ``g_idx[k] == k // group_size``) are
found once after loading (``contiguous_group_size``) and kept as the layer's
``int4_group_size``; the Triton kernel then reads one scale and zero row per group
and K tile instead of gathering them per element through ``g_idx`` (0: act-order,
the general path).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.quantization.base import LinearMethod, replace_param

PACK = 8  # int4 values per int32
SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)  # bit offset of nibble i


def unpack_cols(packed: torch.Tensor, order: list[int] | None = None) -> torch.Tensor:
    """(R, C) int32 -> (R, 8 * C) int32: nibble i of column c is column ``8c + order[i]``."""
    nibbles = (packed[:, :, None] >> SHIFTS.to(packed.device)) & 0xF  # (R, C, 8)
    if order is not None:
        inverse = torch.tensor(order).argsort()
        nibbles = nibbles[:, :, inverse.to(packed.device)]
    return nibbles.reshape(packed.shape[0], -1)


def pack_rows(values: torch.Tensor) -> torch.Tensor:
    """(K, N) ints in 0..15 -> (K // 8, N) int32, eight consecutive rows per element."""
    k, n = values.shape
    grouped = values.to(torch.int32).reshape(k // PACK, PACK, n) << SHIFTS.to(values.device)[None, :, None]
    return grouped.sum(dim=1, dtype=torch.int32)  # disjoint bits: the sum is a bitwise or


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """(K // 8, N) int32 -> (K, N) int32; inverse of ``pack_rows``."""
    nibbles = (packed[:, None, :] >> SHIFTS.to(packed.device)[None, :, None]) & 0xF  # (K/8, 8, N)
    return nibbles.reshape(-1, packed.shape[1])


def dequantize(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The real (K, N) weight in ``dtype`` (computed in fp32)."""
    groups = g_idx.long()
    q = unpack_rows(qweight) - zeros[groups].to(torch.int32)  # (K, N)
    return (q.to(torch.float32) * scales[groups].to(torch.float32)).to(dtype)


def contiguous_group_size(g_idx: torch.Tensor, num_groups: int) -> int:
    """``K // num_groups`` when ``g_idx`` is ``arange(K) // (K // num_groups)`` (groups of
    consecutive input rows, in order), else 0 (act-order, or groups of unequal size)."""
    k = g_idx.shape[0]
    if num_groups < 1 or k % num_groups:
        return 0
    size = k // num_groups
    expected = torch.arange(k, device=g_idx.device) // size
    return size if torch.equal(g_idx.to(expected.dtype), expected) else 0


class Int4LinearMethod(LinearMethod):
    """Base of AWQ and GPTQ: the formats differ in what they load, not in how they multiply."""

    def finish(
        self, layer: nn.Module, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor
    ) -> None:
        """Replace the checkpoint's parameters with the common layout (module docstring)."""
        for name in list(layer.param_specs):
            delattr(layer, name)
        layer.param_specs = {}
        replace_param(layer, "qweight", qweight.contiguous())
        replace_param(layer, "scales", scales.contiguous())
        replace_param(layer, "zeros", zeros.to(torch.uint8).contiguous())
        replace_param(layer, "g_idx", g_idx.to(torch.int32).contiguous())
        layer.int4_group_size = contiguous_group_size(layer.g_idx, layer.scales.shape[0])

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.device.type == "cuda":
            from minivllm.quantization.triton_int4 import int4_matmul

            w = (layer.qweight, layer.scales, layer.zeros, layer.g_idx)
            y = int4_matmul(x.reshape(-1, x.shape[-1]), *w, group_size=layer.int4_group_size)
            y = y.reshape(*x.shape[:-1], -1)
            return y if bias is None else y + bias
        weight = dequantize(layer.qweight, layer.scales, layer.zeros, layer.g_idx, x.dtype)
        return F.linear(x, weight.t(), bias)
