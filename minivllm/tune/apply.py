"""Use a tuning run's best.yaml from Python: ``LLM.from_config(load_tuned(path))``.

best.yaml is a Hydra primary config (report.py), so the command line needs nothing
from here: ``python -m minivllm --config-dir SWEEP_DIR --config-name best task=serve``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from minivllm.config.store import register_configs
from minivllm.config.vllm_config import VllmConfig


def load_tuned(path: str | Path, overrides: Sequence[str] = ()) -> VllmConfig:
    """The validated config of ``path`` (a best.yaml), with Hydra ``overrides`` on top."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"load_tuned: {path} is not a file (a tuning run writes best.yaml into its sweep folder)")
    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(path.parent), version_base="1.3"):
        cfg = compose(config_name=path.stem, overrides=list(overrides))
    return VllmConfig.from_dictconfig(cfg)
