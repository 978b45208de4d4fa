"""Finding a checkpoint and its Hugging Face config without touching the network.

A ``model.path`` may be a local directory, a hub id already in the local HF cache,
or (for presets run with ``load.format=dummy``) nothing at all: then the preset's
inline ``hf_config`` gives the architecture's shape.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoConfig, PretrainedConfig


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
