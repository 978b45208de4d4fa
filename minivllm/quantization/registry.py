"""Quantization methods by name, and how a model gets them.

``model.quantization`` (vLLM's ``quantization``) names a method; when it is
unset, config.json's ``quantization_config.quant_method`` decides. The config
checks the checkpoint's settings and keeps them as a ``QuantizationSpec``
(``config/model.py``); the loader builds the method's config from it
(``build_quant_config``), calls ``quantize_model`` on the model built on the
meta device (so the unquantized weights it replaces never take memory) and
``process_weights_after_loading`` once the checkpoint is in.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minivllm.config.model import QuantizationSpec
from minivllm.quantization.awq import AWQConfig
from minivllm.quantization.base import QuantizationConfig
from minivllm.quantization.compressed_tensors import CompressedTensorsConfig
from minivllm.quantization.fp8 import Fp8Config
from minivllm.quantization.gptq import GPTQConfig
from minivllm.quantization.mxfp4 import Mxfp4Config

QUANTIZATION_METHODS: dict[str, type[QuantizationConfig]] = {
    cls.name: cls for cls in (Fp8Config, CompressedTensorsConfig, AWQConfig, GPTQConfig, Mxfp4Config)
}


def build_quant_config(spec: QuantizationSpec) -> QuantizationConfig:
    """The method's config object for the checked settings the config holds (``cfg.quant_spec``)."""
    return QUANTIZATION_METHODS[spec.method](**spec.settings)


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
