"""Registers the schema in Hydra's ConfigStore and offers ``compose()``.

The YAML options live in the top-level ``conf/`` directory, which is installed as
the ``minivllm.conf`` package, so the same tree is found from a checkout and from
a wheel. ``compose`` may be called any number of times in one process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from minivllm.config.presets import check_model_choice
from minivllm.config.vllm_config import VllmConfig

CONFIG_MODULE = "minivllm.conf"
CONFIG_NAME = "config"
SCHEMA_NAME = "vllm_config_schema"


ASSETS_DIR = Path(__file__).resolve().parents[1] / "assets"


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
