"""Loading checkpoint tensors into a model by name, the LM head that loading ties to the
embedding, and what the runner does to a loaded model's modules: oneDNN-packed CPU weights
(``pack_cpu_weights``) and ``compilation.torch_compile`` (``compile_small_ops``)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch import nn

from minivllm.attention.kv_quant import load_kv_scale
from minivllm.distributed.pipeline import missing_module_names, on_last_stage, tie_where_held
from minivllm.layers.activation import ActAndMul
from minivllm.layers.embedding import ParallelLMHead
from minivllm.layers.norm import RMSNorm
from minivllm.layers.rotary import RotaryEmbedding
from minivllm.layers.weight_utils import default_weight_loader
from minivllm.quantization.cpu_panel_gemm import PanelWeight

FUSABLE = (RMSNorm, ActAndMul, RotaryEmbedding)
"""The layers ``compile_small_ops`` compiles: chains of tiny elementwise kernels in eager mode."""

PackedMapping = dict[str, tuple[str, Any]]
"""checkpoint sub-name -> (fused parameter sub-name, shard id), e.g. "q_proj" -> ("qkv_proj", "q")."""
Resolver = Callable[[str], "tuple[str, Any] | None"]
"""checkpoint name -> (parameter name, shard id), or None to fall back on ``packed``."""


class MissingWeightsError(ValueError):
    """Some parameters received no tensor. Raised after every given tensor was loaded, so a
    partial update of a running model (``worker/weight_update.py``) may catch it and carry on."""

    def __init__(self, missing: set[str]) -> None:
        super().__init__(f"checkpoint has no tensors for: {', '.join(sorted(missing)[:8])}")
        self.missing = missing


def load_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, Any]],
    packed: PackedMapping | None = None,
    skip: tuple[str, ...] = (),
    resolve: Resolver | None = None,
) -> set[str]:
    """Copy each checkpoint tensor into its parameter; return the parameter names loaded.

    Names containing any of ``skip`` are ignored (e.g. rotary caches, a tied
    ``lm_head.weight``), and so are those of the modules another pipeline stage holds. ``resolve`` maps names ``packed`` cannot express (per-expert
    tensors into stacked parameters) and is asked first. Raises ValueError when a checkpoint name matches no parameter,
    and ``MissingWeightsError`` (after loading every tensor given) when a parameter received nothing.
    """
    skip = (*skip, *missing_module_names(model))
    params = dict(model.named_parameters())
    loaded_names: set[str] = set()
    owners: set[nn.Module] = set()
    for name, tensor in weights:
        if any(s in name for s in skip) or load_kv_scale(model, name, tensor):
            continue
        target, shard = (resolve and resolve(name)) or _packed_target(name, packed or {})
        if target not in params:
            raise ValueError(f"checkpoint tensor {name!r} matches no parameter of {type(model).__name__}")
        param = params[target]
        owner = model.get_submodule(target.rpartition(".")[0])
        loader = getattr(owner, "weight_loader", None)
        if loader is not None:
            loader(param, tensor, shard)
        else:
            default_weight_loader(param, tensor)
        loaded_names.add(target)
        owners.add(owner)
    repack_cpu_weights(model, owners)
    missing = set(params) - loaded_names
    if missing:
        raise MissingWeightsError(missing)
    return loaded_names


def pack_cpu_weights(model: nn.Module, min_weights: int = 0) -> int:
    """Pack the CPU weight of every unquantized linear layer and the LM head holding at least
    ``min_weights`` weights (``device.cpu_packed_linear``, ``pack_cpu_weight``); returns how
    many layers it packed. A quantized layer has no ``weight`` (its packed ints are its own) and is left alone."""
    return sum(
        module.pack_for_cpu()
        for module in model.modules()
        if hasattr(module, "pack_for_cpu")
        and isinstance(getattr(module, "weight", None), torch.Tensor)
        and module.weight.numel() >= min_weights
    )


def packed_cpu_weight_bytes(model: nn.Module) -> int:
    """Bytes of the packed copies (``pack_cpu_weights``): as many as the weights they copy (fp32
    panels pad the output columns to a whole panel)."""
    total = 0
    for m in model.modules():
        packed = getattr(m, "cpu_packed_weight", None)
        if packed is not None:
            total += packed.nbytes if isinstance(packed, PanelWeight) else m.weight.numel() * m.weight.element_size()
    return total


def repack_cpu_weights(model: nn.Module, owners: set[nn.Module]) -> None:
    """Pack again the packed layers whose weight was just loaded (an in-place weight update; a head
    tied to a loaded embedding too), so that no packed copy is stale. No-op while nothing is packed."""
    for module in model.modules():
        if getattr(module, "cpu_packed_weight", None) is None:
            continue
        if module in owners or module.__dict__.get("_tied_embedding") in owners:
            module.pack_for_cpu()


def compile_small_ops(model: nn.Module) -> int:
    """``compilation.torch_compile``: replace the forward of every ``FUSABLE`` module with a
    compiled one (one fused kernel for each norm, rotary embedding, gated activation); returns
    how many. Matmuls and attention are left alone (already single, tuned kernels). Each shape
    family compiles on its first call (``dynamic=True``), i.e. during the profile run."""
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


def stage_lm_head(vocab_size: int, hidden_size: int, embedding: nn.Module, tie: bool) -> nn.Module:
    """The LM head on the last pipeline stage (a ``MissingLayer`` elsewhere). With ``tie`` it shares
    ``embedding``'s weight where this stage holds both; ``tied_head_weights`` loads it where not."""
    head = on_last_stage(lambda: ParallelLMHead(vocab_size, hidden_size))
    if tie:
        tie_where_held(head, embedding)
    return head


def _packed_target(name: str, packed: PackedMapping) -> tuple[str, Any]:
    for part, (fused, shard) in packed.items():
        if f".{part}." in name:
            return name.replace(f".{part}.", f".{fused}."), shard
    return name, None
