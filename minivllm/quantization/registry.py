"""Quantization methods by name, and how a model gets them.

``model.quantization`` (vLLM's ``quantization``) names a method; when it is
unset, config.json's ``quantization_config.quant_method`` decides. The loader
calls ``quantize_model`` on the model built on the meta device (so the
unquantized weights it replaces never take memory) and
``process_weights_after_loading`` once the checkpoint is in.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minivllm.quantization.awq import AWQConfig
from minivllm.quantization.base import QuantizationConfig
from minivllm.quantization.compressed_tensors import CompressedTensorsConfig
from minivllm.quantization.fp8 import Fp8Config
from minivllm.quantization.gptq import GPTQConfig

QUANTIZATION_METHODS: dict[str, type[QuantizationConfig]] = {
    cls.name: cls for cls in (Fp8Config, CompressedTensorsConfig, AWQConfig, GPTQConfig)
}
QUANTIZED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
"""Families whose quantized checkpoints load and are tested: checkpoint names are module
names, and fused layers have one checkpoint tensor per member (not Phi-3's fused ones)."""


def get_quantization_config(requested: str | None, hf_config: Any, architecture: str) -> QuantizationConfig | None:
    """The checkpoint's quantization, checked against ``model.quantization``; None when unquantized."""
    config = getattr(hf_config, "quantization_config", None)
    if config is not None and not isinstance(config, dict):
        config = config.to_dict()
    found = str(config.get("quant_method", "")).lower() if config else None
    if requested == "fp8" and found is None:  # online: the loader quantizes the model-dtype weights
        _check_architecture(architecture, requested)
        return Fp8Config.online()
    if requested is not None and found != requested:
        have = f"quant_method={found!r}" if found else "no quantization_config"
        raise ValueError(
            f"model.quantization={requested!r}, but the checkpoint's config.json has {have}"
            + ("; of the methods only fp8 quantizes an unquantized checkpoint while loading" if not found else "")
        )
    if found is None:
        return None
    if found not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization method {found!r} (config.json quantization_config.quant_method) is not "
                         f"supported; supported: {sorted(QUANTIZATION_METHODS)}")
    _check_architecture(architecture, found)
    return QUANTIZATION_METHODS[found].from_config(config)


def _check_architecture(architecture: str, method: str) -> None:
    if architecture not in QUANTIZED_ARCHITECTURES:
        raise ValueError(f"quantized {architecture} checkpoints ({method}) are not supported; quantization "
                         f"supports {list(QUANTIZED_ARCHITECTURES)}")


def quantize_model(model: nn.Module, quant_config: QuantizationConfig, params_dtype: torch.dtype) -> None:
    """Give every linear layer its method; the method re-creates the layer's weights."""
    packed = getattr(model, "packed_modules_mapping", {})
    for prefix, module in model.named_modules():
        if hasattr(module, "set_quant_method"):
            method = quant_config.get_linear_method(prefix, checkpoint_members(prefix, packed))
            if method is not None:
                module.set_quant_method(method, params_dtype)


def process_weights_after_loading(model: nn.Module) -> None:
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)


def checkpoint_members(prefix: str, packed: dict[str, tuple[str, Any]]) -> list[str]:
    """Checkpoint names of a layer: ``...qkv_proj`` -> ``...q_proj``, ``...k_proj``, ``...v_proj``."""
    parent, _, leaf = prefix.rpartition(".")
    members = [part for part, (fused, _) in packed.items() if fused == leaf]
    if not members:
        return [prefix]
    return [f"{parent}.{m}" if parent else m for m in members]
