"""Registers the schema in Hydra's ConfigStore and offers ``compose()``.

The YAML options live in the top-level ``conf/`` directory, which is installed as
the ``minivllm.conf`` package, so the same tree is found from a checkout and from
a wheel. ``compose`` may be called any number of times in one process.

Model presets are the options of the ``model`` group (``conf/model/NAME.yaml``):
``model=NAME`` picks one, as any Hydra group choice does; a checkpoint (a directory,
a ``.gguf`` file or a hub id) goes in the key ``model.path``. vLLM users type
``--model PATH``, so ``model=PATH`` is the first thing they try: Hydra would answer
with a missing ``model//PATH`` config, so it is caught first (``check_model_choice``)
and answered with the override that works. ``LLM(model=...)`` takes either, see
``llm_kwargs``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from minivllm.config.vllm_config import VllmConfig

CONFIG_MODULE = "minivllm.conf"
CONFIG_NAME = "config"
SCHEMA_NAME = "vllm_config_schema"

ASSETS_DIR = Path(__file__).resolve().parents[1] / "assets"
PRESETS_DIR = Path(__file__).resolve().parents[1] / "conf" / "model"


def register_configs() -> None:
    """Make the root schema available to ``conf/config.yaml``'s defaults list, and
    ``${asset:NAME}`` resolve to a directory shipped inside the package."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=VllmConfig)
    if not OmegaConf.has_resolver("asset"):
        OmegaConf.register_new_resolver("asset", lambda name: str(ASSETS_DIR / name))


def compose(overrides: Sequence[str] = (), config_name: str = CONFIG_NAME) -> DictConfig:
    """The config tree the CLI would build for the same overrides.

    >>> cfg = compose(["model=opt-125m", "load.format=dummy", "cache.block_size=32"])
    """
    check_model_choice(overrides)
    register_configs()
    if GlobalHydra.instance().is_initialized():
        # Another Hydra app (or an earlier compose) owns the global state; start clean.
        GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=list(overrides))


def build_config(overrides: Sequence[str] = ()) -> VllmConfig:
    """``compose`` and validate: the typed config with its derived values."""
    return VllmConfig.from_dictconfig(compose(overrides))


def model_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def is_preset(name: str) -> bool:
    return "/" not in name and (PRESETS_DIR / f"{name}.yaml").is_file()


def check_model_choice(overrides: Sequence[str]) -> None:
    """Raise ValueError for ``model=X`` when X is a path or hub id (it holds a ``/`` or
    ends in ``.gguf``) and no preset. A bare unknown name is left to Hydra, whose error
    lists the presets, and so is a sweep (``model=a,b``, ``model=choice(...)``)."""
    for override in overrides:
        key, sep, value = override.partition("=")
        if key.lstrip("+") != "model" or not sep or "," in value or "(" in value:
            continue
        if ("/" in value or value.endswith(".gguf")) and not is_preset(value):
            raise ValueError(
                f"model={value}: not a model preset ({', '.join(model_presets())}); "
                f"a checkpoint directory, .gguf file or hub id goes in model.path: model.path={value}"
            )
