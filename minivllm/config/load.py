"""The ``load`` group, and the one step that reads the model's config from disk.

``load`` says how weights are read (a format, or the loader class a user points at
their own); ``auto`` values are resolved by ``VllmConfig``. Reading disk happens
here and nowhere else in the config: ``read_checkpoint`` is called once when
``VllmConfig`` is built (a draft model's config is built the same way), and the
other readers (``generation_defaults``, ``tokenizer_vocab``, ``safetensors_names``)
are called by name where their values are needed.

A ``model.path`` may be a local directory, a hub id already in the local HF cache,
a GGUF file (or a directory holding exactly one), or (for presets run with
``load.format=dummy``) nothing at all: then the preset's inline ``hf_config`` gives
the architecture's shape. Nothing here touches the network.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from safetensors import safe_open
from transformers import AutoConfig, GenerationConfig, LlamaConfig, PretrainedConfig

from minivllm.config.model import ModelConfig, check_choice

logger = logging.getLogger(__name__)

LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy", "gguf", "tensorizer", "sharded_state")
LOADER_TARGETS = {
    "gguf": "minivllm.model_loader.gguf_loader.GGUFModelLoader",
    "tensorizer": "minivllm.model_loader.tensorizer_loader.TensorizerModelLoader",
    "sharded_state": "minivllm.model_loader.sharded_state.ShardedStateLoader",
}
DEFAULT_LOADER = "minivllm.model_loader.loader.DefaultModelLoader"


@dataclass
class LoadConfig:
    """How weights are read."""

    format: str = "auto"
    """Weights: auto (safetensors, else .bin/.pt), safetensors, pt, dummy (random), gguf, tensorizer, sharded_state."""
    loader: Any = None
    """``_target_`` node of the model loader; null follows ``format``."""
    use_tqdm: bool = True
    """Show a progress bar while loading weight files (only on a terminal)."""
    download_dir: Optional[str] = None
    """HF cache directory to find hub checkpoints in; defaults to the HF cache."""

    def __post_init__(self) -> None:
        check_choice("load.format", self.format, LOAD_FORMATS)

    def loader_target(self) -> str:
        """The loader class ``format`` picks (used when ``loader`` is null)."""
        return LOADER_TARGETS.get(self.format, DEFAULT_LOADER)


def read_checkpoint(model: ModelConfig, load: LoadConfig) -> tuple[PretrainedConfig, Path | None]:
    """The model's config and the directory holding it (None for a preset's inline config).

    This is the one step that reads the checkpoint's config from disk: config.json through
    transformers (a local directory or the local HF cache), or a GGUF file's metadata
    (``load.format=gguf``). ``model.hf_overrides`` and ``model.architecture`` are applied to
    it. A checkpoint found nowhere is a ``ModelNotFoundError`` naming ``model.path``.
    """
    overrides = dict(model.hf_overrides)
    if load.format == "gguf":
        gguf_file = find_gguf_file(model.path)
        hf_config, directory = gguf_hf_config(gguf_file), gguf_file.parent
        for key, value in overrides.items():
            setattr(hf_config, key, value)
    else:
        hf_config, directory = load_hf_config(
            model.path,
            inline=model.hf_config,
            overrides=overrides,
            allow_inline=load.format == "dummy",
            hub=HubOptions.of(model, load),
        )
    if model.architecture:
        hf_config.architectures = [model.architecture]
    return hf_config, directory


# Checkpoint directories and hub ids.


class ModelNotFoundError(ValueError):
    """The checkpoint is neither a local directory nor in the local HF cache."""


@dataclass(frozen=True)
class HubOptions:
    """How a hub id is looked up in the local HF cache and loaded by transformers."""

    revision: str | None = None
    """Branch, tag or commit; None is the cache's ``main``."""
    cache_dir: str | None = None
    """The HF cache to look in; None is the default cache."""
    trust_remote_code: bool = False
    code_revision: str | None = None

    @classmethod
    def of(cls, model: ModelConfig, load: LoadConfig, tokenizer: bool = False) -> HubOptions:
        """The options ``model`` and ``load`` give (``tokenizer``: for the tokenizer's hub entry)."""
        revision = (model.tokenizer_revision or model.revision) if tokenizer else model.revision
        return cls(revision, load.download_dir, model.trust_remote_code, model.code_revision)

    def config_kwargs(self) -> dict[str, Any]:
        """Keywords for ``AutoConfig.from_pretrained`` on a local directory."""
        kwargs: dict[str, Any] = {"trust_remote_code": self.trust_remote_code}
        if self.code_revision is not None:
            kwargs["code_revision"] = self.code_revision
        return kwargs


def find_local_checkpoint(path: str, hub: HubOptions = HubOptions()) -> Path | None:
    """A directory holding ``config.json`` for ``path``, or None. Never downloads."""
    local = Path(path).expanduser()
    if local.is_dir():
        return local if (local / "config.json").is_file() else None
    if local.is_absolute() or path.startswith((".", "~")) or path.count("/") > 1:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub ships with transformers
        return None
    try:
        cached = try_to_load_from_cache(
            repo_id=path, filename="config.json", cache_dir=hub.cache_dir, revision=hub.revision
        )
    except Exception:  # malformed repo ids land here; treat as "not cached"
        return None
    return Path(cached).parent if isinstance(cached, (str, os.PathLike)) else None


def load_hf_config(
    path: str,
    *,
    inline: dict[str, Any] | None,
    overrides: dict[str, Any],
    allow_inline: bool,
    hub: HubOptions = HubOptions(),
) -> tuple[PretrainedConfig, Path | None]:
    """Return the model's config and the local checkpoint directory (None for inline)."""
    local = find_local_checkpoint(path, hub)
    if local is not None:
        hf_config = AutoConfig.from_pretrained(local, local_files_only=True, **hub.config_kwargs())
    elif inline is not None and allow_inline:
        hf_config = config_from_dict(inline)
    else:
        raise ModelNotFoundError(_not_found_message(path, has_inline=inline is not None, hub=hub))
    apply_hf_overrides(hf_config, overrides)
    return hf_config, local


_ROPE_DICT_KEYS = ("rope_scaling", "rope_parameters")


def apply_hf_overrides(hf_config: PretrainedConfig, overrides: dict[str, Any]) -> None:
    """Set each ``model.hf_overrides`` key on the config.

    transformers 5 keeps ``rope_theta`` inside ``rope_parameters``, so replacing
    that dict (or the older ``rope_scaling``) would lose the base; an override
    without ``rope_theta`` keeps the checkpoint's. ``rope_theta`` alone updates
    the base inside a flat ``rope_parameters``.
    """
    for key, value in overrides.items():
        if isinstance(value, Mapping):
            value = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in value.items()}
        current = getattr(hf_config, "rope_parameters", None)
        flat = isinstance(current, dict) and "rope_type" in current
        if key in _ROPE_DICT_KEYS and isinstance(value, dict) and ("rope_type" in value or "type" in value):
            if flat and value.get("rope_theta") is None:
                value = {**value, "rope_theta": current.get("rope_theta")}
            key = "rope_parameters"
        elif key == "rope_theta" and flat:
            current["rope_theta"] = value
        setattr(hf_config, key, value)
        if key == "rope_parameters" and hasattr(hf_config, "standardize_rope_params"):
            hf_config.standardize_rope_params()
    if "num_hidden_layers" in overrides:
        _resize_layer_types(hf_config, overrides)


_PER_LAYER_KEYS = ("layer_types", "mlp_layer_types")


def _resize_layer_types(hf_config: PretrainedConfig, overrides: dict[str, Any]) -> None:
    """transformers fills per-layer lists (``layer_types``) for the checkpoint's layer count
    when the config is built, and refuses to save a config whose list has another length.
    A ``num_hidden_layers`` override keeps layer i's type: the list is cut, or repeated
    cyclically (as the periodic sliding/full patterns are) when layers are added."""
    n = hf_config.num_hidden_layers
    for key in _PER_LAYER_KEYS:
        types = getattr(hf_config, key, None)
        if key in overrides or not isinstance(types, list) or not types or len(types) == n:
            continue
        setattr(hf_config, key, [types[i % len(types)] for i in range(n)])


def config_from_dict(inline: dict[str, Any]) -> PretrainedConfig:
    inline = dict(inline)
    model_type = inline.pop("model_type", None)
    if model_type is None:
        raise ValueError("model.hf_config: needs a 'model_type' key (e.g. opt, llama)")
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"model.hf_config.model_type={model_type!r}: unknown to transformers")
    return CONFIG_MAPPING[model_type](**inline)


def _looks_local(path: str) -> bool:
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or Path(path).expanduser().exists()


def _not_found_message(path: str, *, has_inline: bool, hub: HubOptions) -> str:
    if _looks_local(path):
        return f"model.path={path!r}: no such checkpoint directory (a folder holding config.json)"
    hint = (
        f"download it where the network is reachable (huggingface-cli download {path}) and point "
        f"model.path at the directory"
    )
    if has_inline:
        hint += ", or run on random weights of the same shape with load.format=dummy"
    where = "".join(
        f", {name}={value!r}" for name, value in (("revision", hub.revision), ("download_dir", hub.cache_dir)) if value
    )
    return f"model.path={path!r}{where}: no local checkpoint (a directory with config.json) or HF cache entry; {hint}"


# GGUF files. A GGUF file (llama.cpp's format) carries no ``config.json``: the model's
# shape is stored as metadata under ``<architecture>.*`` keys, the vocabulary under
# ``tokenizer.ggml.*``.

GGUF_ARCHITECTURES = ("llama",)
"""GGUF ``general.architecture`` values that load (Llama and its look-alikes, e.g. Mistral)."""


def find_gguf_file(path: str) -> Path:
    """The ``.gguf`` file that ``model.path`` names, directly or as the only one in a directory."""
    local = Path(path).expanduser()
    if local.is_file() and local.suffix == ".gguf":
        return local
    if local.is_dir():
        found = sorted(local.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise ValueError(f"model.path={path!r}: holds several .gguf files ({names}); name one of them")
    raise ValueError(f"model.path={path!r}: load.format=gguf needs a .gguf file or a directory holding one")


def read_metadata(gguf_path: Path) -> tuple[dict[str, Any], list[str]]:
    """Scalar metadata (arrays only as their length, tokens aside) and the tensor names of a file."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(str(gguf_path))
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if not field.types:
            continue
        if field.types[0] == GGUFValueType.ARRAY:
            meta[key] = len(field.data)
        else:
            meta[key] = field.contents()
    return meta, [t.name for t in reader.tensors]


def gguf_hf_config(gguf_path: Path) -> PretrainedConfig:
    """The transformers config that the file's metadata describes."""
    meta, tensor_names = read_metadata(gguf_path)
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"model.path={str(gguf_path)!r}: GGUF architecture {arch!r} is not supported; "
            f"supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    if meta.get(f"{arch}.rope.scaling.type", "none") != "none" or "rope_freqs.weight" in tensor_names:
        raise ValueError(f"model.path={str(gguf_path)!r}: GGUF files with RoPE scaling are not supported")
    return LlamaConfig(**_llama_fields(meta, arch, tensor_names))


def _llama_fields(meta: dict[str, Any], arch: str, tensor_names: list[str]) -> dict[str, Any]:
    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ValueError(f"GGUF metadata: missing {arch}.{name}")
        return value

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": int(key("vocab_size", meta.get("tokenizer.ggml.tokens"))),
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(key("attention.key_length", hidden // heads)),
        "max_position_embeddings": int(key("context_length")),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }


# Default SamplingParams from a checkpoint's ``generation_config.json`` (vLLM's
# ``generation_config``). With ``model.generation_config=auto`` the sampling fields the
# checkpoint's generation config sets away from transformers' defaults become the defaults
# of ``LLM.generate`` / ``LLM.chat`` when no SamplingParams is given (as vLLM does);
# ``vllm`` turns this off; any other value is a folder holding a ``generation_config.json``.

# generation_config.json key -> SamplingParams field
_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def generation_defaults(source: str, checkpoint_dir: Path | None) -> dict[str, Any]:
    """SamplingParams keywords from the generation config that ``source`` (``model.generation_config``)
    names, the checkpoint's own in ``checkpoint_dir`` for ``auto`` ({} when off or absent)."""
    if source == "vllm":
        return {}
    folder = checkpoint_dir if source == "auto" else Path(source).expanduser()
    if folder is None or not (Path(folder) / "generation_config.json").is_file():
        if source != "auto":
            raise ValueError(f"model.generation_config={source!r}: no generation_config.json in that folder")
        return {}
    diff = GenerationConfig.from_pretrained(str(folder), local_files_only=True).to_diff_dict()
    defaults = {field: diff[key] for key, field in _FIELDS.items() if diff.get(key) is not None}
    if defaults:
        logger.info("Default sampling parameters from %s/generation_config.json: %s", folder, defaults)
    return defaults


# What a draft model is checked against its target with (``VllmConfig``'s speculative checks).


def tokenizer_vocab(path: str) -> dict | None:
    """The token -> id map of a checkpoint's tokenizer.json (added tokens included); None without one."""
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        return None
    data = json.loads(file.read_text())
    vocab = dict(data.get("model", {}).get("vocab") or {})
    vocab.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
    return vocab


def safetensors_names(directory: Path) -> set[str]:
    """The tensor names of every ``*.safetensors`` file in ``directory``."""
    names: set[str] = set()
    for file in Path(directory).glob("*.safetensors"):
        with safe_open(file, "pt") as f:
            names.update(f.keys())
    return names
