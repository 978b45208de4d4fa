"""Quantized checkpoints built from the shared small Llama (GQA, untied), once per session."""

from __future__ import annotations

import pytest

from tests.quantization import packers as pk

AWQ_CONFIG = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}


def _ct_config(weights: dict, acts: dict | None, fmt: str) -> dict:
    group = {"targets": ["Linear"], "weights": {"num_bits": 8, "symmetric": True, **weights}, "input_activations": acts}
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {"group_0": group},
        "ignore": ["lm_head"],
    }


CASES = {
    "fp8-tensor-static": (
        lambda: pk.fp8_quantizer(per_channel=False, input_scale=True),
        {"quant_method": "fp8", "activation_scheme": "static"},
    ),
    "fp8-channel-dynamic": (
        lambda: pk.fp8_quantizer(per_channel=True, input_scale=False),
        {"quant_method": "fp8", "activation_scheme": "dynamic"},
    ),
    "ct-fp8-tensor-static": (
        lambda: pk.fp8_quantizer(per_channel=False, input_scale=True, scale_shape="one"),
        _ct_config(
            {"type": "float", "strategy": "tensor"},
            {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False},
            "float-quantized",
        ),
    ),
    "ct-fp8-channel-token": (
        lambda: pk.fp8_quantizer(per_channel=True, input_scale=False),
        _ct_config(
            {"type": "float", "strategy": "channel"},
            {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
            "float-quantized",
        ),
    ),
    "ct-int8-w8a16": (
        lambda: pk.int8_channel_quantizer,
        _ct_config({"type": "int", "strategy": "channel"}, None, "naive-quantized"),
    ),
    "ct-w4a16-packed-g32": (
        lambda: pk.ct_packed_quantizer(4, 32),
        _ct_config({"type": "int", "num_bits": 4, "strategy": "group", "group_size": 32}, None, "pack-quantized"),
    ),
    "ct-w8a16-packed-channel": (
        lambda: pk.ct_packed_quantizer(8, None),
        _ct_config({"type": "int", "strategy": "channel"}, None, "pack-quantized"),
    ),
    "awq-g32": (lambda: pk.awq_quantizer(32), AWQ_CONFIG),
    "gptq-g32": (
        lambda: pk.gptq_quantizer(32, desc_act=False),
        {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": False},
    ),
    "gptq-g32-desc-act": (
        lambda: pk.gptq_quantizer(32, desc_act=True),
        {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False},
    ),
}


@pytest.fixture(scope="session")
def quantized_pair(llama_dir, tmp_path_factory):
    """``quantized_pair(case)`` -> (quantized dir, dequantized plain dir), built once per case."""
    built = {}

    def make(case: str):
        if case not in built:
            quantizer, config = CASES[case]
            built[case] = pk.write_pair(llama_dir, tmp_path_factory.mktemp(case), quantizer(), config)
        return built[case]

    return make
