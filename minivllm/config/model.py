"""The ``model`` group: which checkpoint to run, in which dtype, with how much context,
and what its config.json says about it (architecture, rope, quantization).

A model describes the checkpoint and how requests may use it (logprob caps, images
per prompt); nothing here reads disk (``load.read_checkpoint`` does, once, when
``VllmConfig`` is built). ``VllmConfig`` resolves ``auto`` values (dtype,
``max_model_len``) from the checkpoint's config with the functions here, and checks
it against the tables here: the architectures this engine runs, the rope types it
computes, the quantization methods it loads. Choices and ranges are checked in
``__post_init__``, naming the key; vLLM's dtype aliases (half, float) become their
canonical names.

The key checks (``check_choice``, ``check_range``, ``Range``) live here too, at the
bottom of the package: every group's ``__post_init__`` calls them, and the request
parameters (``sampling_params.RANGES``) read the same ``Range``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import torch

logger = logging.getLogger(__name__)


# Key checks: a ValueError naming the key and what is allowed.


def check_choice(key: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{key}={value!r}: must be one of {', '.join(map(str, allowed))}")


@dataclass(frozen=True)
class Range:
    """The numbers from ``low`` to ``high`` (None: unbounded on that side), each end included
    unless it is open. A table of these is what both the engine's checks and the server's
    schema read (``sampling_params.RANGES``)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    said: str | None = None
    """How a message words what is allowed, where the interval alone would mislead (e.g. ``top_k``)."""

    def __str__(self) -> str:
        lo = "-inf" if self.low is None else f"{self.low}"
        hi = "inf" if self.high is None else f"{self.high}"
        opening = "(" if self.low_open or self.low is None else "["
        closing = ")" if self.high_open or self.high is None else "]"
        return f"{opening}{lo}, {hi}{closing}"

    def allows(self, value: float) -> bool:
        """NaN is in no range: every comparison with it is false, so it would pass the bounds."""
        if value != value:
            return False
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        return not (too_low or too_high)

    def message(self, key: str, value: Any) -> str:
        return f"{key}={value!r}: must be {self.said or f'in {self}'}"

    def check(self, key: str, value: float) -> None:
        """Raise unless ``value`` is a number in the range."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{key}={value!r}: must be a number")
        if not self.allows(value):
            raise ValueError(self.message(key, value))


def check_range(
    key: str,
    value: float,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """Raise unless ``low <= value <= high`` (or ``<`` where the bound is open)."""
    Range(low, high, low_open, high_open).check(key, value)


# The group.
MODEL_DTYPES = ("auto", "float32", "float16", "bfloat16")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
"""vLLM's other names for the same dtypes."""
RUNNERS = ("generate", "pooling")
MODALITIES = ("image",)
POOLING_TYPES = ("LAST", "MEAN")


@dataclass
class PoolerConfig:
    """How model.runner=pooling turns a prompt's hidden states into one vector (vLLM's pooler_config)."""

    pooling_type: str = "LAST"
    """LAST (the last prompt token's hidden state) or MEAN (the mean over the prompt; turns prefix caching off)."""
    normalize: bool = True
    """L2-normalize embeddings unless a request says otherwise."""

    def __post_init__(self) -> None:
        self.pooling_type = str(self.pooling_type).upper()
        check_choice("model.pooler_config.pooling_type", self.pooling_type, POOLING_TYPES)


@dataclass
class ModelConfig:
    """Which checkpoint to run, in which dtype, with how much context."""

    path: str = "???"
    """Local checkpoint directory (Hugging Face layout) or hub id."""
    tokenizer: Optional[str] = None
    """Tokenizer directory or hub id; defaults to ``path``."""
    dtype: str = "auto"
    """Weight and activation dtype: auto (checkpoint's; float32 on CPU), float32 (float), float16 (half), bfloat16."""
    max_model_len: Optional[int] = None
    """Longest prompt + output in tokens; defaults to the checkpoint's max_position_embeddings."""
    seed: int = 0
    """Seed for random weights (load.format=dummy) and for sampling without a per-request seed."""
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    """Keys merged into the checkpoint's config.json (e.g. {num_hidden_layers: 2})."""
    hf_config: Optional[dict[str, Any]] = None
    """Inline config.json for presets, used when ``path`` is not found locally (with load.format=dummy)."""
    architecture: Optional[str] = None
    """Override for config.json's ``architectures[0]`` (picks the model class)."""
    max_logprobs: int = 20
    """Most logprobs a request may ask for per token; -1 puts no limit (logprobs=-1 then means the whole vocabulary)."""
    quantization: Optional[str] = None
    """Quantization method (fp8, compressed-tensors, awq, gptq, mxfp4); null: config.json's decides; fp8 on an unquantized checkpoint quantizes while loading."""
    revision: Optional[str] = None
    """Branch, tag or commit of a hub checkpoint looked up in the local HF cache."""
    tokenizer_revision: Optional[str] = None
    """Revision of the tokenizer's hub entry in the local HF cache; defaults to ``revision``."""
    code_revision: Optional[str] = None
    """Revision of a hub model's custom code (with trust_remote_code)."""
    trust_remote_code: bool = False
    """Let transformers run the checkpoint's own config and tokenizer code."""
    generation_config: str = "auto"
    """Default SamplingParams: auto (the checkpoint's generation_config.json), vllm (none), or a folder holding one."""
    runner: str = "generate"
    """generate (sample tokens) or pooling (return pooled hidden states: LLM.embed / LLM.encode)."""
    pooler_config: PoolerConfig = field(default_factory=PoolerConfig)
    """Pooling type and normalization for runner=pooling."""
    limit_mm_per_prompt: dict[str, int] = field(default_factory=dict)
    """Most items per prompt by modality (on the command line: +model.limit_mm_per_prompt.image=2); a model that takes images allows 1 by default."""
    allowed_local_media_path: str = ""
    """Folder whose files a chat message may name as file:// image URLs; empty: local files are refused."""
    mm_processor_cache_gb: float = 4.0
    """Size of the front end's cache of processed images (keyed by content hash); 0 turns it off."""
    enable_sleep_mode: bool = False
    """Allow LLM.sleep / wake_up (free the KV cache and the weights' memory between rollouts)."""

    def __post_init__(self) -> None:
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        check_choice("model.dtype", self.dtype, MODEL_DTYPES + tuple(DTYPE_ALIASES))
        if self.quantization is not None:
            check_choice("model.quantization", self.quantization, QUANT_METHODS)
        if self.max_model_len is not None:
            check_range("model.max_model_len", self.max_model_len, low=1)
        if self.max_logprobs != -1:
            check_range("model.max_logprobs", self.max_logprobs, low=0)
        check_choice("model.runner", self.runner, RUNNERS)
        for modality, limit in dict(self.limit_mm_per_prompt).items():
            check_choice("model.limit_mm_per_prompt", modality, MODALITIES)
            check_range(f"model.limit_mm_per_prompt.{modality}", limit, low=0)
        check_range("model.mm_processor_cache_gb", self.mm_processor_cache_gb, low=0.0)


# What the checkpoint's config says: dtype, context length, architecture.

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


ENCODER_ONLY = (
    "bert",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "deberta",
    "deberta-v2",
    "electra",
    "modernbert",
    "mpnet",
    "nomic_bert",
    "camembert",
    "albert",
)


def refuse_encoder_only(hf_config: Any, architecture: str) -> None:
    if getattr(hf_config, "model_type", None) in ENCODER_ONLY:
        raise ValueError(
            f"architecture {architecture!r} (model_type {hf_config.model_type!r}) is an encoder-only (bidirectional) "
            f"model: not supported; minivllm runs decoder-only models, for generation or for embeddings with "
            f"model.runner=pooling (e.g. Qwen3-Embedding, gte-Qwen2)"
        )


def architecture_of(hf_config: Any) -> str:
    archs = getattr(hf_config, "architectures", None) or []
    if not archs:
        raise ValueError("config.json has no 'architectures' entry; set model.architecture (e.g. LlamaForCausalLM)")
    return archs[0]


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes in bf16 natively (x86: AVX512-BF16 or AMX-BF16; Arm: the bf16
    feature). ``cpuinfo``: /proc/cpuinfo's text (read when None); unknown (unreadable) counts as yes."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return True
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):
            return bool({"avx512_bf16", "amx_bf16", "bf16"} & set(line.split(":", 1)[-1].split()))
    return True


def resolve_dtype(name: str, hf_config: Any, device_type: str) -> torch.dtype:
    if name != "auto":
        if name == "bfloat16" and device_type == "cpu" and not cpu_has_native_bf16():
            raise ValueError(
                "model.dtype=bfloat16: this CPU has no native bf16 (no avx512_bf16 or amx_bf16 in /proc/cpuinfo), "
                "so every matmul would convert to fp32 and run slower than fp32 weights; use model.dtype=float32"
            )
        return DTYPES[name]
    if device_type == "cpu":
        return torch.float32
    ckpt = getattr(hf_config, "torch_dtype", None) or getattr(hf_config, "dtype", None)
    if isinstance(ckpt, str):
        ckpt = DTYPES.get(ckpt)
    if ckpt in (None, torch.float32):
        return torch.bfloat16
    return ckpt


def resolve_max_model_len(requested: int | None, hf_config: Any) -> int:
    limit = getattr(hf_config, "max_position_embeddings", None) or getattr(hf_config, "n_positions", None)
    if requested is None:
        if limit is None:
            raise ValueError("model.max_model_len: the checkpoint names no max_position_embeddings; set it")
        return int(limit)
    if limit is not None and requested > limit:
        raise ValueError(f"model.max_model_len={requested}: larger than the model's max_position_embeddings={limit}")
    return requested


# The architectures this engine runs: config.json ``architectures`` names and where each
# model class lives. The table is data (``"package.module:ClassName"``, or a class
# registered by an out-of-tree package), so a config can refuse an unknown architecture
# when it is built without importing a model. ``models/registry.py``'s ``ModelRegistry``
# reads and writes the same dict, ``ARCHITECTURES``, and imports the class a name stands
# for when the loader asks.

ARCHITECTURES: dict[str, Any] = {
    "OPTForCausalLM": "minivllm.models.opt:OPTForCausalLM",
    "LlamaForCausalLM": "minivllm.models.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "minivllm.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "minivllm.models.qwen3:Qwen3ForCausalLM",
    "MistralForCausalLM": "minivllm.models.mistral:MistralForCausalLM",
    "MixtralForCausalLM": "minivllm.models.mixtral:MixtralForCausalLM",
    "Qwen3MoeForCausalLM": "minivllm.models.qwen3_moe:Qwen3MoeForCausalLM",
    "Phi3ForCausalLM": "minivllm.models.phi3:Phi3ForCausalLM",
    "Gemma2ForCausalLM": "minivllm.models.gemma2:Gemma2ForCausalLM",
    "Gemma3ForCausalLM": "minivllm.models.gemma3:Gemma3ForCausalLM",
    "Olmo2ForCausalLM": "minivllm.models.olmo2:Olmo2ForCausalLM",
    "GraniteForCausalLM": "minivllm.models.granite:GraniteForCausalLM",
    "GPT2LMHeadModel": "minivllm.models.gpt2:GPT2LMHeadModel",
    "GPTNeoXForCausalLM": "minivllm.models.gpt_neox:GPTNeoXForCausalLM",
    "DeepseekV2ForCausalLM": "minivllm.models.deepseek_v2:DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM": "minivllm.models.deepseek_v2:DeepseekV3ForCausalLM",
    "GptOssForCausalLM": "minivllm.models.gpt_oss:GptOssForCausalLM",
    "Qwen3NextForCausalLM": "minivllm.models.qwen3_next:Qwen3NextForCausalLM",
    # vision-language models (images in the prompt: minivllm/multimodal/)
    "LlavaForConditionalGeneration": "minivllm.models.llava:LlavaForConditionalGeneration",
    "Qwen2VLForConditionalGeneration": "minivllm.models.qwen2_vl:Qwen2VLForConditionalGeneration",
    # decoder-only base models (no LM head): model.runner=pooling only
    "LlamaModel": "minivllm.pooling.base_models:LlamaBaseModel",
    "Qwen2Model": "minivllm.pooling.base_models:Qwen2BaseModel",
    "Qwen3Model": "minivllm.pooling.base_models:Qwen3BaseModel",
    "MistralModel": "minivllm.pooling.base_models:MistralBaseModel",
}
"""Architecture name -> its model class, as ``"package.module:ClassName"`` or the class itself.
One dict per process, shared by every ``ArchitectureTable`` (registrations included)."""
POOLING_ONLY = frozenset({"LlamaModel", "Qwen2Model", "Qwen3Model", "MistralModel"})
"""Architectures without an LM head: they can only embed."""


def linear_attention_layers(text_config: Any) -> list[int]:
    """Indices of the layers whose ``layer_types`` entry is ``linear_attention`` (a hybrid model:
    Qwen3-Next, whose configs may give ``full_attention_interval`` instead); empty for others."""
    types = getattr(text_config, "layer_types", None)
    if not types and getattr(text_config, "model_type", None) == "qwen3_next":
        interval = getattr(text_config, "full_attention_interval", 4)
        return [i for i in range(text_config.num_hidden_layers) if (i + 1) % interval]
    return [i for i, t in enumerate(types or []) if t == "linear_attention"]


class ArchitectureTable:
    """Names, registration and the supported-check over a shared architecture dict."""

    def __init__(self, models: dict[str, Any]) -> None:
        self._models = models
        """Not a copy: the config's check sees what ``ModelRegistry`` registers."""

    def register_model(self, architecture: str, model: Any) -> None:
        """``model`` is a class or a ``"package.module:ClassName"`` string (imported on first use)."""
        if isinstance(model, str) and ":" not in model:
            raise ValueError(f"register_model({architecture!r}, {model!r}): expected 'package.module:ClassName'")
        self._models[architecture] = model

    def get_supported_archs(self) -> list[str]:
        return sorted(self._models)

    def is_supported(self, architecture: str) -> bool:
        return architecture in self._models

    def check_supported(self, architecture: str) -> None:
        """Raise a ValueError naming the supported architectures when ``architecture`` is not one."""
        if architecture not in self._models:
            raise ValueError(
                f"architecture {architecture!r} is not supported; supported are: "
                f"{', '.join(self.get_supported_archs())} (or register your own with "
                f"ModelRegistry.register_model, or set model.architecture)"
            )


SUPPORTED_ARCHITECTURES = ArchitectureTable(ARCHITECTURES)
"""What ``VllmConfig`` checks ``architectures[0]`` (or ``model.architecture``) against."""


# The ``rope_type`` a checkpoint names, read from its config: what ``layers/rotary.py``
# builds and what the config checks when it is built (a rope_type this engine lacks fails there).

ROPE_TYPES = ("default", "linear", "llama3", "dynamic", "yarn", "longrope")
"""The schemes ``layers/rotary.py`` computes frequencies for."""


def rope_parameters(hf_config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """One flat ``{"rope_theta": ..., "rope_type": ..., **scaling}`` dict.

    Reads transformers 5's ``rope_parameters`` (flat, or nested by layer type as
    Gemma 3 stores a base per ``sliding_attention`` / ``full_attention``; pass
    ``layer_type`` to pick one) and the older ``rope_scaling`` + ``rope_theta``.
    """
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = dict(params[layer_type])
    if params.get("rope_theta") is None:
        params["rope_theta"] = getattr(hf_config, "rope_theta", None) or 10000.0
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if params["rope_type"] == "mrope":  # older Qwen2-VL configs: default frequencies, sectioned by mrope_section
        params["rope_type"] = "default"
    if params.get("original_max_position_embeddings") is None:
        original = getattr(hf_config, "original_max_position_embeddings", None)
        params["original_max_position_embeddings"] = original or getattr(hf_config, "max_position_embeddings", None)
    long_factors = getattr(hf_config, LONG_FACTORS_ATTR, None)
    if params["rope_type"] == "longrope" and long_factors is not None:
        params["use_long_factors"] = long_factors
    return params


LONG_FACTORS_ATTR = "minivllm_longrope_long_factors"
"""Set on the checkpoint's config by ``choose_longrope_factors``: the engine's choice, read by ``rope_parameters``."""


def choose_longrope_factors(hf_config: Any, max_model_len: int) -> None:
    """LongRoPE (Phi-3 128k style) rotates every position with one set of factors, fixed
    when the model is built, since cached keys cannot be re-rotated. As vLLM does, the long
    factors are used only when ``max_model_len`` exceeds ``original_max_position_embeddings``;
    a context capped at the original one keeps the short factors, which is what transformers
    uses for every sequence that short. Records the choice on ``hf_config``."""
    params = rope_parameters(hf_config)
    if params["rope_type"] != "longrope":
        return
    original = params["original_max_position_embeddings"]
    use_long = max_model_len > original
    setattr(hf_config, LONG_FACTORS_ATTR, use_long)
    if use_long:
        logger.warning(
            "LongRoPE: max_model_len=%d exceeds original_max_position_embeddings=%d, so every position uses the "
            "long factors, also in sequences shorter than %d (transformers uses the short factors for those, so "
            "their output differs); set model.max_model_len=%d or less to use the short factors",
            max_model_len,
            original,
            original,
            original,
        )
    elif getattr(hf_config, "max_position_embeddings", 0) > original:
        logger.warning(
            "LongRoPE: max_model_len=%d is within original_max_position_embeddings=%d, so the short factors are "
            "used; the long factors need model.max_model_len above %d",
            max_model_len,
            original,
            original,
        )


def check_rope_types(hf_config: Any) -> None:
    """Fail when the config is built, not in the worker, on a ``rope_type`` this engine lacks."""
    raw = getattr(hf_config, "rope_parameters", None) or {}
    nested = [key for key, value in raw.items() if isinstance(value, dict)]
    for layer_type in nested or [None]:
        rope_type = rope_parameters(hf_config, layer_type)["rope_type"]
        if rope_type not in ROPE_TYPES:
            key = "rope_parameters" + (f".{layer_type}" if layer_type else "") + ".rope_type"
            raise ValueError(f"model config {key}={rope_type!r}: supported are {', '.join(ROPE_TYPES)}")


# A checkpoint's quantization: the method's name and its checked settings.
# ``model.quantization`` (vLLM's ``quantization``) names a method; when it is unset,
# config.json's ``quantization_config.quant_method`` decides. Everything a checkpoint's
# ``quantization_config`` says is checked here, when ``VllmConfig`` is built, so an
# unsupported one fails before any work starts, naming what is wrong. The result is a
# ``QuantizationSpec``: the method and the keyword arguments of its config class in
# ``minivllm/quantization/``, which the loader builds (``quantization.registry.build_quant_config``)
# to hand each linear layer its method.

QUANT_METHODS = ("awq", "compressed-tensors", "fp8", "gptq", "mxfp4")
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


MXFP4_ARCHITECTURES = ("GptOssForCausalLM",)
"""Families whose MXFP4 experts load (the format of gpt-oss's released checkpoints)."""


def _check_architecture(architecture: str, method: str) -> None:
    if method == "mxfp4":
        if architecture not in MXFP4_ARCHITECTURES:
            raise ValueError(
                f"mxfp4 {architecture} checkpoints are not supported; mxfp4 (expert weights) supports "
                f"{list(MXFP4_ARCHITECTURES)}"
            )
        return
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


def mxfp4_settings(config: dict[str, Any]) -> dict[str, Any]:
    """config.json: ``{"quant_method": "mxfp4", "modules_to_not_convert": [...]}`` (gpt-oss's experts)."""
    return {"modules_to_not_convert": list(config.get("modules_to_not_convert") or [])}


SETTINGS_PARSERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "mxfp4": mxfp4_settings,
    "fp8": fp8_settings,
    "awq": awq_settings,
    "gptq": gptq_settings,
    "compressed-tensors": compressed_tensors_settings,
}
"""quant_method -> the check of its ``quantization_config`` (keyword arguments of its config class)."""
