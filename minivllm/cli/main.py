"""The command line: ``python -m minivllm [group=option ...] [key=value ...]``.

``@hydra.main`` only parses; ``run(cfg)`` does the work and is what tests call.
A config or input error prints one line naming the key (full trace with
``hydra.verbose=true``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Callable

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from minivllm.cli.vllm_flags import flag_hint
from minivllm.config.store import check_model_choice, register_configs
from minivllm.config.vllm_config import VllmConfig
from minivllm.plugins import load_general_plugins

logger = logging.getLogger("minivllm")


def _tasks() -> dict[str, Callable[[VllmConfig, Path], dict[str, Any]]]:
    from minivllm.cli.generate import run_generate

    tasks: dict[str, Callable] = {"generate": run_generate}
    try:
        from minivllm.bench.run import run_bench

        tasks["bench"] = run_bench
    except ImportError:
        pass
    try:
        from minivllm.serve.server import run_serve

        tasks["serve"] = run_serve
    except ImportError:
        pass
    return tasks


def output_dir() -> Path:
    """Hydra's folder for this run (or this multirun job); the cwd outside Hydra."""
    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        return Path.cwd()


def run(cfg: DictConfig, out_dir: Path | None = None) -> dict[str, Any]:
    """Validate the composed config, save the resolved tree, and run its task."""
    load_general_plugins(cfg.get("plugins"))  # before the config checks the architecture a plugin may add
    vcfg = VllmConfig.from_dictconfig(cfg)
    out_dir = out_dir or output_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(vcfg.to_dictconfig()))
    tasks = _tasks()
    if vcfg.task.name not in tasks:
        raise ValueError(f"task={vcfg.task.name}: not available in this installation ({', '.join(tasks)})")
    return tasks[vcfg.task.name](vcfg, out_dir)


def _verbose() -> bool:
    try:
        return bool(HydraConfig.get().verbose)
    except ValueError:
        return False


def _multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False


def _sweep_job(cfg: DictConfig) -> Any:
    """One multirun job; under a tune preset (``+tune=...``), its score for the sweeper."""
    from minivllm.bench.sweep import run_sweep_job

    if not cfg.tune.enabled:
        return run_sweep_job(run, cfg, output_dir())
    from minivllm.tune.objective import claim_device, release_memory, sweeper_value

    if cfg.tune.devices:  # one GPU per trial process, claimed before CUDA starts
        claim_device(cfg.tune.devices, Path(HydraConfig.get().sweep.dir) / ".devices")
    result = run_sweep_job(run, cfg, output_dir())
    if result.get("status") == "failed":
        release_memory()
    return sweeper_value(result, OmegaConf.to_object(cfg.tune.slo), output_dir().name)


@hydra.main(config_path="pkg://minivllm.conf", config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> Any:
    if _multirun():  # a failing job is recorded in its metrics.json; the sweep goes on
        return _sweep_job(cfg)
    try:
        if cfg.tune.enabled:
            raise ValueError("+tune=...: tuning is a sweep; run it with -m (python -m minivllm -m +tune=serving ...)")
        return run(cfg)
    except (ValueError, FileNotFoundError) as err:
        if _verbose():
            raise
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"error: {first_line}", file=sys.stderr)
        sys.exit(2)


_CONFIG_DIR_FLAGS = ("--config-dir", "-cd", "--config-path", "-cp", "hydra.searchpath", "+hydra.searchpath")


def main() -> None:
    args = sys.argv[1:]
    try:  # before Hydra, whose own answers are a missing ``model//PATH`` config and ``unrecognized arguments``
        hint = flag_hint(args)
        if hint:
            raise ValueError(hint)
        if not any(a.startswith(_CONFIG_DIR_FLAGS) for a in args):  # a user's own model/ group may nest
            check_model_choice([a for a in args if not a.startswith("-")])
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    register_configs()
    _hydra_main()
