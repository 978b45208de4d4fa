"""Quantized linear layers: fp8, compressed-tensors (fp8, int8 W8A16, packed W4A16), AWQ and GPTQ int4."""

from minivllm.quantization.base import LinearMethod, ParamSpec, QuantizationConfig, UnquantizedLinearMethod
from minivllm.quantization.registry import (
    QUANTIZATION_METHODS,
    build_quant_config,
    process_weights_after_loading,
    quantize_model,
)

__all__ = [
    "LinearMethod",
    "ParamSpec",
    "QuantizationConfig",
    "UnquantizedLinearMethod",
    "QUANTIZATION_METHODS",
    "build_quant_config",
    "process_weights_after_loading",
    "quantize_model",
]
