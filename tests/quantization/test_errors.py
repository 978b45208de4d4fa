"""What a user sees for a quantized checkpoint that cannot be loaded: a ValueError
naming the problem, never a silent load."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from minivllm import LLM
from minivllm.config.model import QUANT_METHODS
from minivllm.config.store import compose
from minivllm.config.vllm_config import VllmConfig
from minivllm.quantization import QUANTIZATION_METHODS


def _with_quant_config(src, dst, quant_config, drop=()):
    dst.mkdir()
    for f in src.iterdir():
        dst.joinpath(f.name).write_bytes(f.read_bytes())
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = quant_config
    (dst / "config.json").write_text(json.dumps(config))
    if drop:
        state = {k: v for k, v in load_file(dst / "model.safetensors").items() if k not in drop}
        save_file(state, dst / "model.safetensors")
    return dst


def test_unknown_quant_method_names_it_and_the_supported_ones(llama_dir, tmp_path):
    ckpt = _with_quant_config(llama_dir, tmp_path / "bnb", {"quant_method": "bitsandbytes"})
    with pytest.raises(
        ValueError, match=r"'bitsandbytes'.*supported: \['awq', 'compressed-tensors', 'fp8', 'gptq', 'mxfp4'\]"
    ):
        LLM(model=str(ckpt))


def test_unknown_quantization_keyword_fails_when_the_config_is_built(llama_dir):
    with pytest.raises(ValueError, match="model.quantization='int3': must be one of awq, compressed-tensors"):
        VllmConfig.from_dictconfig(compose([f"model.path={llama_dir}", "model.quantization=int3"]))


def test_int4_keyword_on_an_unquantized_checkpoint_is_refused(llama_dir):
    with pytest.raises(ValueError, match="model.quantization='awq'.*no quantization_config; of the methods only fp8"):
        VllmConfig.from_dictconfig(compose([f"model.path={llama_dir}", "model.quantization=awq"]))


def test_awq_config_over_plain_weights_names_the_stray_tensor(llama_dir, tmp_path):
    config = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}
    ckpt = _with_quant_config(llama_dir, tmp_path / "plain", config)
    with pytest.raises(
        ValueError, match=r"checkpoint tensor 'model\.layers\.\d\.\w+\.\w+_proj\.weight' matches no parameter"
    ):
        LLM(model=str(ckpt), dtype="float32", num_gpu_blocks_override=8)


def test_awq_checkpoint_with_missing_tensors_names_them(quantized_pair, tmp_path):
    quant_dir, _ = quantized_pair("awq-g32")
    config = json.loads((quant_dir / "config.json").read_text())["quantization_config"]
    drop = ("model.layers.1.mlp.down_proj.qzeros",)
    ckpt = _with_quant_config(quant_dir, tmp_path / "missing", config, drop=drop)
    with pytest.raises(ValueError, match=r"checkpoint has no tensors for: model\.layers\.1\.mlp\.down_proj\.qzeros"):
        LLM(model=str(ckpt), dtype="float32", num_gpu_blocks_override=8)


@pytest.mark.parametrize(
    ("quant_config", "message"),
    [
        (
            {"quant_method": "awq", "bits": 4, "group_size": 16},
            r"awq quantization_config.group_size=16: allowed \[32, 64, 128\]",
        ),
        ({"quant_method": "awq", "bits": 8, "group_size": 32}, "awq quantization_config.bits=8: only 4"),
        (
            {"quant_method": "gptq", "bits": 4, "group_size": 32, "checkpoint_format": "marlin"},
            "checkpoint_format='marlin'",
        ),
        ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}, "weight_block_size"),
        ({"quant_method": "fp8", "activation_scheme": "sometimes"}, "activation_scheme='sometimes'"),
        ({"quant_method": "compressed-tensors", "format": "marlin-24", "config_groups": {}}, "format='marlin-24'"),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "pack-quantized",
                "config_groups": {
                    "g": {
                        "targets": ["Linear"],
                        "weights": {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 16},
                    }
                },
            },
            "pack-quantized weights .*group_size: 16",
        ),
    ],
)
def test_unsupported_settings_fail_when_the_config_is_built(llama_dir, tmp_path, quant_config, message):
    ckpt = _with_quant_config(llama_dir, tmp_path / "ckpt", quant_config)
    with pytest.raises(ValueError, match=message):
        VllmConfig.from_dictconfig(compose([f"model.path={ckpt}"]))


def test_quantized_checkpoint_of_an_untested_family_is_refused(opt_dir, tmp_path):
    ckpt = _with_quant_config(opt_dir, tmp_path / "opt-fp8", {"quant_method": "fp8"})
    with pytest.raises(ValueError, match=r"quantized OPTForCausalLM checkpoints \(fp8\) are not supported"):
        VllmConfig.from_dictconfig(compose([f"model.path={ckpt}"]))


def test_the_config_checks_the_methods_the_package_builds():
    """``model.quantization``'s choices (config) are the classes ``build_quant_config`` knows."""
    assert list(QUANT_METHODS) == sorted(QUANTIZATION_METHODS)
