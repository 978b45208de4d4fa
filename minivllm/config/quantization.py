"""A checkpoint's quantization as the config describes it: the method's name and its checked settings.

``model.quantization`` (vLLM's ``quantization``) names a method; when it is
unset, config.json's ``quantization_config.quant_method`` decides. Everything a
checkpoint's ``quantization_config`` says is checked here, when ``VllmConfig`` is
built, so an unsupported one fails before any work starts, naming what is wrong.
The result is a ``QuantizationSpec``: the method and the keyword arguments of its
config class in ``minivllm/quantization/``, which the loader builds
(``quantization.registry.build_quant_config``) to hand each linear layer its method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

QUANT_METHODS = ("awq", "compressed-tensors", "fp8", "gptq")
"""The methods ``minivllm/quantization/`` implements (``model.quantization`` choices)."""
QUANTIZED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
"""Families whose quantized checkpoints load and are tested: checkpoint names are module
names, and fused layers have one checkpoint tensor per member (not Phi-3's fused ones)."""

FP8_ACTIVATION_SCHEMES = ("static", "dynamic")
AWQ_GROUP_SIZES = (32, 64, 128)
GPTQ_GROUP_SIZES = (-1, 32, 64, 128)
GPTQ_ZERO_OFFSET = {"gptq": 1, "gptq_v2": 0}
"""GPTQ checkpoint formats: v1 ("gptq") stores zero - 1, v2 ("gptq_v2") the zero."""
CT_FORMATS = ("float-quantized", "int-quantized", "naive-quantized", "pack-quantized")
CT_STRATEGIES = ("tensor", "channel")
CT_PACKED_GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True)
class QuantizationSpec:
    """Which method, with which settings (the keyword arguments of its config class)."""

    method: str
    settings: dict[str, Any]


def resolve_quantization(requested: str | None, hf_config: Any, architecture: str) -> QuantizationSpec | None:
    """The checkpoint's quantization, checked against ``model.quantization``; None when unquantized."""
    config = getattr(hf_config, "quantization_config", None)
    if config is not None and not isinstance(config, dict):
        config = config.to_dict()
    found = str(config.get("quant_method", "")).lower() if config else None
    if requested == "fp8" and found is None:  # online: the loader quantizes the model-dtype weights
        _check_architecture(architecture, requested)
        return QuantizationSpec("fp8", {"activation_scheme": "dynamic", "ignored_layers": [], "serialized": False})
    if requested is not None and found != requested:
        have = f"quant_method={found!r}" if found else "no quantization_config"
        raise ValueError(
            f"model.quantization={requested!r}, but the checkpoint's config.json has {have}"
            + ("; of the methods only fp8 quantizes an unquantized checkpoint while loading" if not found else "")
        )
    if found is None:
        return None
    if found not in QUANT_METHODS:
        raise ValueError(
            f"quantization method {found!r} (config.json quantization_config.quant_method) is not "
            f"supported; supported: {sorted(QUANT_METHODS)}"
        )
    _check_architecture(architecture, found)
    return QuantizationSpec(found, SETTINGS_PARSERS[found](config))


def _check_architecture(architecture: str, method: str) -> None:
    if architecture not in QUANTIZED_ARCHITECTURES:
        raise ValueError(
            f"quantized {architecture} checkpoints ({method}) are not supported; quantization "
            f"supports {list(QUANTIZED_ARCHITECTURES)}"
        )


def fp8_settings(config: dict[str, Any]) -> dict[str, Any]:
    """config.json: ``{"quant_method": "fp8", "activation_scheme": "static"|"dynamic", "ignored_layers": [...]}``."""
    scheme = config.get("activation_scheme", "dynamic")
    if scheme not in FP8_ACTIVATION_SCHEMES:
        allowed = list(FP8_ACTIVATION_SCHEMES)
        raise ValueError(f"fp8 quantization_config.activation_scheme={scheme!r}: allowed {allowed}")
    if config.get("weight_block_size") is not None:
        raise ValueError("fp8 quantization_config.weight_block_size: block-wise fp8 scales are not supported")
    return {"activation_scheme": scheme, "ignored_layers": list(config.get("ignored_layers") or [])}


def awq_settings(config: dict[str, Any]) -> dict[str, Any]:
    """config.json: ``{"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"}``."""
    bits = config.get("bits", config.get("w_bit"))
    group = config.get("group_size", config.get("q_group_size"))
    if bits != 4:
        raise ValueError(f"awq quantization_config.bits={bits}: only 4 is supported")
    if group not in AWQ_GROUP_SIZES:
        raise ValueError(f"awq quantization_config.group_size={group}: allowed {list(AWQ_GROUP_SIZES)}")
    if not config.get("zero_point", True):
        raise ValueError("awq quantization_config.zero_point=false is not supported (AWQ gemm checkpoints have zeros)")
    version = str(config.get("version", "gemm")).lower()
    if version != "gemm":
        raise ValueError(f"awq quantization_config.version={version!r}: only 'gemm' is supported")
    return {"group_size": group, "modules_to_not_convert": list(config.get("modules_to_not_convert") or [])}


def gptq_settings(config: dict[str, Any]) -> dict[str, Any]:
    """config.json: ``{"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false}``."""
    bits, group = config.get("bits"), config.get("group_size")
    if bits != 4:
        raise ValueError(f"gptq quantization_config.bits={bits}: only 4 is supported")
    if group not in GPTQ_GROUP_SIZES:
        raise ValueError(f"gptq quantization_config.group_size={group}: allowed {list(GPTQ_GROUP_SIZES)}")
    fmt = config.get("checkpoint_format", "gptq")
    if fmt not in GPTQ_ZERO_OFFSET:
        raise ValueError(f"gptq quantization_config.checkpoint_format={fmt!r}: allowed {list(GPTQ_ZERO_OFFSET)}")
    if config.get("lm_head", False):
        raise ValueError("gptq quantization_config.lm_head=true: a quantized lm_head is not supported")
    skip = list(config.get("modules_to_not_convert") or [])
    return {
        "group_size": group,
        "desc_act": bool(config.get("desc_act", False)),
        "zero_offset": GPTQ_ZERO_OFFSET[fmt],
        "skip": skip,
    }


def compressed_tensors_settings(config: dict[str, Any]) -> dict[str, Any]:
    """llm-compressor's ``config_groups``: one group targeting ``Linear``, its weight / activation args."""
    fmt = config.get("format")
    if fmt not in CT_FORMATS:
        raise ValueError(f"compressed-tensors format={fmt!r} is not supported; supported: {list(CT_FORMATS)}")
    groups = list((config.get("config_groups") or {}).values())
    if len(groups) != 1:
        raise ValueError(f"compressed-tensors: exactly one entry in config_groups is supported, got {len(groups)}")
    group = groups[0]
    if "Linear" not in (group.get("targets") or []):
        raise ValueError(
            f"compressed-tensors config_groups targets={group.get('targets')}: only ['Linear'] is supported"
        )
    weights, acts = group.get("weights") or {}, group.get("input_activations")
    ignore = list(config.get("ignore") or [])
    if fmt == "pack-quantized":
        group_size = weights.get("group_size") if weights.get("strategy") == "group" else None
        return {
            "scheme": _packed_scheme(weights, acts),
            "static_input": False,
            "ignore": ignore,
            "group_size": group_size,
        }
    scheme, static = _scheme(weights, acts)
    return {"scheme": scheme, "static_input": static, "ignore": ignore}


def _scheme(weights: dict[str, Any], acts: dict[str, Any] | None) -> tuple[str, bool]:
    """(scheme, static input scale) for the supported weight / activation argument pairs."""
    kind, bits, strategy = weights.get("type"), weights.get("num_bits"), weights.get("strategy")
    if bits != 8 or strategy not in CT_STRATEGIES or not weights.get("symmetric", True):
        raise ValueError(
            f"compressed-tensors weights {{type: {kind}, num_bits: {bits}, strategy: {strategy}}}: supported are "
            f"symmetric 8-bit float (W8A8-FP8) or int (W8A16) with strategy in {list(CT_STRATEGIES)}"
        )
    if kind == "float":
        if not acts or acts.get("type") != "float" or acts.get("num_bits") != 8:
            raise ValueError("compressed-tensors fp8 weights need fp8 input_activations (the W8A8-FP8 scheme)")
        dynamic = bool(acts.get("dynamic", False))
        allowed = ("tensor", "token") if dynamic else ("tensor",)
        if acts.get("strategy") not in allowed:
            raise ValueError(
                f"compressed-tensors input_activations strategy={acts.get('strategy')!r} with "
                f"dynamic={dynamic}: allowed {list(allowed)}"
            )
        return "fp8", not dynamic
    if kind == "int" and acts is None:
        return "int8-w8a16", False
    raise ValueError(
        f"compressed-tensors: weights of type {kind!r} with input_activations {acts}: supported are "
        f"W8A8-FP8 and int8 W8A16"
    )


def _packed_scheme(weights: dict[str, Any], acts: dict[str, Any] | None) -> str:
    """pack-quantized: symmetric int4 (per group or channel) or int8 (per channel), weight-only."""
    bits, strategy, group = weights.get("num_bits"), weights.get("strategy"), weights.get("group_size")
    ok_group = strategy == "channel" or (strategy == "group" and group in CT_PACKED_GROUP_SIZES and bits == 4)
    if weights.get("type") != "int" or bits not in (4, 8) or not ok_group or not weights.get("symmetric", True) or acts:
        raise ValueError(
            f"compressed-tensors pack-quantized weights {{num_bits: {bits}, strategy: {strategy}, group_size: {group}}}"
            f" with input_activations {acts}: supported are symmetric int4 per channel or per group "
            f"{list(CT_PACKED_GROUP_SIZES)}, and int8 per channel, weight-only"
        )
    return "int4-packed" if bits == 4 else "int8-packed"


SETTINGS_PARSERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "fp8": fp8_settings,
    "awq": awq_settings,
    "gptq": gptq_settings,
    "compressed-tensors": compressed_tensors_settings,
}
"""quant_method -> the check of its ``quantization_config`` (keyword arguments of its config class)."""
