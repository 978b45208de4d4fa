"""Weight memory of each quantization method on a preset's shape, and the KV-cache
tokens the saved bytes would hold.

The model is built on the meta device (no memory is allocated), each method
swaps in its parameters, ``process_weights_after_loading`` converts them to the
layout kept for serving, and the bytes are counted from the parameter shapes:

    python benchmarks/quant_memory.py --model llama-3.2-1b
"""

from __future__ import annotations

import argparse

import torch

from minivllm.config.store import compose
from minivllm.config.vllm_config import VllmConfig
from minivllm.models.registry import ModelRegistry
from minivllm.quantization import QUANTIZATION_METHODS, process_weights_after_loading, quantize_model

GiB = 1 << 30
METHODS = {
    "none": None,
    "fp8 (per-tensor, static activations)": {"quant_method": "fp8", "activation_scheme": "static"},
    "compressed-tensors int8 W8A16": {
        "quant_method": "compressed-tensors",
        "format": "naive-quantized",
        "config_groups": {
            "g": {
                "targets": ["Linear"],
                "input_activations": None,
                "weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
            }
        },
    },
    "compressed-tensors W4A16 (group 128)": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "g": {
                "targets": ["Linear"],
                "input_activations": None,
                "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128},
            }
        },
    },
    "awq (group 128)": {"quant_method": "awq", "bits": 4, "group_size": 128},
    "gptq (group 128)": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False},
}


def weight_bytes(cfg: VllmConfig, quant: dict | None) -> tuple[int, int]:
    """(all parameter bytes, linear-layer parameter bytes) of the model in ``cfg.dtype``."""
    with torch.device("meta"):
        model = ModelRegistry.resolve(cfg.architecture)(cfg.hf_config, None).to(cfg.dtype)
        if quant is not None:
            quantize_model(model, QUANTIZATION_METHODS[quant["quant_method"]].from_config(quant), cfg.dtype)
            process_weights_after_loading(model)
    params = list(model.named_parameters())
    total = sum(p.numel() * p.element_size() for _, p in params)
    linear = sum(p.numel() * p.element_size() for n, p in params if "_proj." in n)
    return total, linear


def kv_bytes_per_token(cfg: VllmConfig) -> int:
    hf = cfg.hf_config
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return 2 * hf.num_hidden_layers * hf.num_key_value_heads * head_dim * cfg.kv_cache_dtype.itemsize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.2-1b", help="a preset under conf/model/")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    cfg = VllmConfig.from_dictconfig(compose([f"model={args.model}", "load.format=dummy", f"model.dtype={args.dtype}"]))
    per_token = kv_bytes_per_token(cfg)
    base_total, base_linear = weight_bytes(cfg, None)
    print(f"{args.model}, {args.dtype}; KV cache {per_token / 1024:.0f} KiB per token\n")
    print("| method | weights (GiB) | linear layers (GiB) | saved (GiB) | KV tokens the saving holds |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, quant in METHODS.items():
        total, linear = weight_bytes(cfg, quant)
        saved = base_total - total
        print(
            f"| {name} | {total / GiB:.3f} | {linear / GiB:.3f} ({linear / base_linear:.2f}x) "
            f"| {saved / GiB:.3f} | {saved // per_token:,} |"
        )


if __name__ == "__main__":
    main()
