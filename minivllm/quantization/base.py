"""The quantization seam: a method object owns a linear layer's weights.

A linear layer knows its shapes and how it is sharded; it does not know how
its weights are stored. It asks its ``LinearMethod`` to

1. ``create_weights``: register the parameters the checkpoint will fill, each
   with a ``ParamSpec`` saying which dims are output / input features (so the
   layer's weight loader can take this rank's slice, and the slice of each
   fused member);
2. ``process_weights_after_loading``: convert what was loaded into the form
   ``apply`` wants (repack, merge scales);
3. ``apply``: compute ``x @ W.T (+ bias)``.

The unquantized layer is itself a method (``UnquantizedLinearMethod``), so the
layers carry no ``if quantized:`` branches (vLLM's ``QuantizeMethodBase``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from minivllm.quantization import cpu_panel_gemm, cpu_small_gemm
from minivllm.quantization.cpu_panel_gemm import PanelWeight


@dataclass(frozen=True)
class ParamSpec:
    """How one parameter of a linear layer lines up with the layer's features.

    ``out_dim`` / ``in_dim``: the tensor dim holding output / input features
    (None: that dim is not sharded along it). ``out_pack``: output features
    per element along ``out_dim`` (8 when eight int4 values share an int32).
    ``per_member``: one scalar per fused member (q, k, v / gate, up), e.g. a
    per-tensor activation scale; the parameter has shape (num_members,).
    ``broadcast``: a checkpoint scalar fills the whole slice it lands in (a
    per-tensor weight scale stored per output channel).
    """

    out_dim: int | None = None
    in_dim: int | None = None
    out_pack: int = 1
    per_member: bool = False
    broadcast: bool = False


@dataclass(frozen=True)
class LinearShape:
    """What a method needs to know about the layer it equips (this rank's view).

    ``output_sizes``: local output features of each fused member (one entry for
    a plain layer); ``input_size``: the layer's full input features.
    """

    input_size_per_partition: int
    output_sizes: tuple[int, ...]
    input_size: int

    @property
    def output_size_per_partition(self) -> int:
        return sum(self.output_sizes)

    @property
    def input_is_sharded(self) -> bool:
        return self.input_size_per_partition != self.input_size


class LinearMethod:
    """Creates, post-processes and applies one linear layer's weights."""

    def create_weights(self, layer: nn.Module, shape: LinearShape, params_dtype: torch.dtype) -> None:
        """Register the layer's weight parameters (``add_param``); ``params_dtype`` is the model dtype."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Called once after every checkpoint tensor is in place."""

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError


class QuantizationConfig:
    """A checkpoint's ``quantization_config``, parsed; hands each linear layer its method."""

    name: str = ""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "QuantizationConfig":
        raise NotImplementedError

    def get_linear_method(self, prefix: str, members: list[str]) -> LinearMethod | None:
        """The method for the layer named ``prefix`` (checkpoint member names ``members``,
        e.g. the q/k/v names of a fused qkv); None leaves it unquantized."""
        raise NotImplementedError


def is_ignored(prefix: str, members: list[str], patterns: list[str]) -> bool:
    """True when every checkpoint member of the layer matches a pattern: a layer the
    checkpoint left unquantized (``ignored_layers``, ``ignore``, ``modules_to_not_convert``).

    A pattern is a module name, a name fragment ending a module path (``lm_head``,
    ``mlp.down_proj``) or a regex prefixed ``re:`` (compressed-tensors). A fused
    layer (qkv) must be ignored for all of its members or for none.
    """
    if not patterns:
        return False
    hits = [any(_matches(name, p) for p in patterns) for name in members]
    if any(hits) and not all(hits):
        raise ValueError(f"{prefix}: fused layer with some members quantized and some not ({members}) is not supported")
    return all(hits)


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    return f".{pattern}." in f".{name}."


def add_param(layer: nn.Module, name: str, shape: tuple[int, ...], dtype: torch.dtype, spec: ParamSpec) -> None:
    """Register an empty (frozen) parameter and its ``ParamSpec`` on ``layer``."""
    layer.register_parameter(name, nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False))
    layer.param_specs[name] = spec


def replace_param(layer: nn.Module, name: str, value: torch.Tensor) -> None:
    """Swap a parameter for a processed tensor (new shape or dtype) after loading."""
    layer.register_parameter(name, nn.Parameter(value, requires_grad=False))
    layer.param_specs.pop(name, None)


class UnquantizedLinearMethod(LinearMethod):
    """A plain (out, in) weight in the model dtype."""

    def create_weights(self, layer: nn.Module, shape: LinearShape, params_dtype: torch.dtype) -> None:
        dims = (shape.output_size_per_partition, shape.input_size_per_partition)
        add_param(layer, "weight", dims, params_dtype, ParamSpec(out_dim=0, in_dim=1))

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        packed = layer.cpu_packed_weight
        if packed is not None:
            return cpu_linear(x, layer.weight, packed, bias)
        return torch.nn.functional.linear(x, layer.weight, bias)


CPU_PACK_BATCH_HINT = 32
"""The rows oneDNN reorders a bf16 weight for (``pack_cpu_weight``); any row count runs on it, and on
this 2-core AVX-512 machine 32 ran 1-2374 rows as fast as a hint of their own (benchmarks/RESULTS.md)."""

CpuPackedWeight = PanelWeight | torch.Tensor
"""A layer's packed CPU weight: fp32 panels for ``cpu_panel_gemm``, or oneDNN's opaque reordered tensor."""


def place_cpu_weight(weight: torch.Tensor) -> torch.Tensor:
    """The plain fp32 weight a packed layer keeps, in memory advised for huge pages
    (``cpu_small_gemm.to_huge_pages``: its one-row kernel reads it there); other dtypes as they are."""
    return cpu_small_gemm.to_huge_pages(weight) if weight.dtype == torch.float32 else weight


def pack_cpu_weight(weight: torch.Tensor) -> CpuPackedWeight:
    """``weight`` (out, in), fp32 or bf16 on the CPU, packed once for ``cpu_packed_linear``: a second
    copy, the parameter stays. fp32 goes into column panels for our C kernel (``cpu_panel_gemm``,
    1.4-1.5x oneDNN at decode batches); bf16, or fp32 where that kernel is not built, is reordered
    into oneDNN's blocked layout (an opaque ``torch._mkldnn`` tensor).

    Linear layers and the LM head hold it as ``cpu_packed_weight`` (``device.cpu_packed_linear``);
    whatever writes their weight after loading packs it again (``models/utils.py:load_weights``)."""
    if weight.dtype == torch.float32 and cpu_panel_gemm.load() is not None:
        return cpu_panel_gemm.pack_panels(weight)
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), CPU_PACK_BATCH_HINT)


def packable_on_cpu(weight: torch.Tensor) -> bool:
    """A plain (out, in) weight that ``pack_cpu_weight`` takes: on the CPU, fp32 or bf16, not freed (sleep)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and weight.dim() == 2
        and weight.numel() > 0
    )


def cpu_packed_linear(x: torch.Tensor, packed: CpuPackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, W, bias)`` on ``packed = pack_cpu_weight(W)``: the panel kernel, or oneDNN's matmul
    (brgemm on AVX-512) with no per-call repacking of W as MKL's sgemm does; equal to ``F.linear`` to
    fp32 rounding (another summation order). x (..., in) -> (..., out)."""
    if isinstance(packed, PanelWeight):
        return cpu_panel_gemm.panel_linear(x, packed, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def cpu_linear(
    x: torch.Tensor, weight: torch.Tensor, packed: CpuPackedWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a layer holding ``packed = pack_cpu_weight(weight)``: few fp32
    rows on the plain weight (``cpu_small_gemm.small_linear``: one row where the weight has panels,
    which serve two rows and up faster; up to ``SMALL_ROWS`` against oneDNN), more on the packed copy
    (``cpu_packed_linear``). x (..., in) -> (..., out)."""
    if cpu_small_gemm.serves(x, weight) and (x.shape[0] == 1 or not isinstance(packed, PanelWeight)):
        return cpu_small_gemm.small_linear(x, weight, bias)
    return cpu_packed_linear(x, packed, bias)
