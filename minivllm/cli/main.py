"""The command line: ``python -m minivllm [group=option ...] [key=value ...]``.

``@hydra.main`` only parses; ``run(cfg)`` does the work and is what tests call.
A config or input error prints one line naming the key (full trace with
``hydra.verbose=true``). ``task=generate`` (``run_generate``) runs the configured
prompts and writes outputs.jsonl and metrics.json; ``task=bench`` and ``task=serve``
are their packages'.

**vLLM's flags.** ``vllm serve MODEL --port 8000 --max-model-len 4096`` is in every
vLLM user's fingers; here the same settings are Hydra overrides (``task=serve
model.path=MODEL serve.port=8000``), and argparse or Hydra would only say
``unrecognized arguments`` or ``missing EQUAL``. ``flag_hint`` turns the flags,
subcommand and model of one command line into a single line that names each one's
override, so the corrected command can be read off it. The flags are not translated
silently: the config tree stays the one way to say what a run does.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from minivllm.config.llm_kwargs import KWARG_KEYS, NOT_IMPLEMENTED
from minivllm.config.store import check_model_choice, register_configs
from minivllm.config.vllm_config import VllmConfig
from minivllm.plugins import load_general_plugins
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger("minivllm")


def _tasks() -> dict[str, Callable[[VllmConfig, Path], dict[str, Any]]]:
    tasks: dict[str, Callable] = {"generate": run_generate}
    try:
        from minivllm.bench.kv_tiers import KV_WORKLOADS, run_kv_bench
        from minivllm.bench.run import run_bench

        tasks["bench"] = lambda cfg, out: (run_kv_bench if cfg.bench.workload in KV_WORKLOADS else run_bench)(cfg, out)
    except ImportError:
        pass
    try:
        from minivllm.serve.disagg_proxy import run_disagg_proxy
        from minivllm.serve.server import run_serve

        tasks["serve"] = run_serve
        tasks["disagg_proxy"] = run_disagg_proxy
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


# ---- task=generate -------------------------------------------------------------------------


def load_prompts(cfg: VllmConfig) -> list[str]:
    if not cfg.prompts_file:
        return list(cfg.prompts)
    path = Path(cfg.prompts_file).expanduser()
    if not path.is_file():
        raise ValueError(f"prompts_file={cfg.prompts_file!r}: no such file")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        return [json.loads(line)["prompt"] for line in lines]
    return lines


def sampling_params(cfg: VllmConfig) -> SamplingParams:
    fields = dict(cfg.sampling)
    try:
        return SamplingParams(**fields)
    except TypeError as err:  # an unknown field name
        raise ValueError(f"sampling: {err}; see SamplingParams for the fields") from None


def run_generate(cfg: VllmConfig, out_dir: Path) -> dict[str, Any]:
    """task=generate: run the configured prompts and write outputs.jsonl and metrics.json."""
    from minivllm.entrypoints.llm import LLM  # the engine is imported only by a task that runs one

    prompts = load_prompts(cfg)
    params = sampling_params(cfg)
    llm = LLM.from_config(cfg)
    try:
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        stats = llm.llm_engine.scheduler_stats()
    finally:
        llm.shutdown()
    with open(out_dir / "outputs.jsonl", "w") as f:
        for out in outputs:
            for c in out.outputs:  # sampling.n completions per prompt
                print(f"\n>>> {out.prompt!r}\n{out.prompt}{c.text}")
                record = {"prompt": out.prompt, "text": c.text, "token_ids": c.token_ids}
                record["finish_reason"] = c.finish_reason
                if len(out.outputs) > 1:
                    record["index"] = c.index
                f.write(json.dumps(record) + "\n")
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    metrics = {
        "num_requests": len(outputs),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "seconds": seconds,
        "output_tokens_per_s": output_tokens / seconds,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / seconds,
        "num_kv_blocks": stats.num_blocks,
        "block_size": cfg.cache.block_size,
        "num_preemptions": stats.num_preemptions,
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print(
        f"\n{len(outputs)} requests, {output_tokens} tokens in {seconds:.2f} s "
        f"({metrics['output_tokens_per_s']:.1f} tok/s); KV blocks {stats.num_blocks}, "
        f"preemptions {stats.num_preemptions}; results in {out_dir}"
    )
    return metrics


# ---- vLLM's flags, answered with Hydra overrides ----------------------------------------------

HYDRA_FLAGS = (
    "--cfg",
    "--config-dir",
    "--config-name",
    "--config-path",
    "--experimental-rerun",
    "--help",
    "--hydra-help",
    "--info",
    "--multirun",
    "--package",
    "--resolve",
    "--run",
    "--shell-completion",
    "--version",
)
"""Hydra's own long flags (its short ones, ``-m`` and the like, never start with ``--``)."""

SERVE_FLAG_KEYS = {
    "model": "model.path",
    "host": "serve.host",
    "port": "serve.port",
    "api_key": "serve.api_key",
    "served_model_name": "serve.served_model_name",
    "chat_template": "serve.chat_template",
    "tool_call_parser": "serve.tool_call_parser",
    "reasoning_parser": "serve.reasoning_parser",
    "lora_modules": "serve.lora_modules",
}
"""Flags of ``vllm serve`` that are no ``LLM(...)`` keyword."""

FLAG_OVERRIDES = {
    "enforce_eager": "compilation.cudagraph=false",
    "disable_log_stats": "scheduler.log_stats_interval=0",
    "enable_auto_tool_choice": "nothing (serve.tool_call_parser=NAME turns it on)",
}
"""Switches whose override is not ``key=true``."""


HYDRA_VALUE_FLAGS = ("--cfg", "-c", "--config-name", "-cn", "--config-dir", "-cd", "--config-path", "-cp")
HYDRA_VALUE_FLAGS += ("--package", "-p", "--info", "-i", "--experimental-rerun", "--shell-completion", "-sc")
"""Hydra flags followed by a value (a bare word after them is theirs)."""

VLLM_SHORT_FLAGS = {
    "-tp": "tensor-parallel-size",
    "-pp": "pipeline-parallel-size",
    "-dp": "data-parallel-size",
    "-q": "quantization",
    "-O": "compilation-config",
}
"""vLLM's short flags (none is one of Hydra's), answered as their long forms: their value
is no model path."""

SUBCOMMANDS = {"serve": "task=serve", "bench": "task=bench", "generate": "task=generate"}
"""``vllm serve MODEL`` and the like: the subcommand is a task here."""


def flag_hint(args: Sequence[str]) -> str | None:
    """One line naming the override for each vLLM-style ``--flag``, subcommand (``serve``) or
    bare model path in ``args``; None when there is none."""
    hints = []
    i = 0
    while i < len(args):
        arg, following = args[i], args[i + 1] if i + 1 < len(args) else ""
        takes_value = following and not following.startswith("-") and "=" not in following
        i += 1
        short, sep, rest = arg.partition("=")
        if short in VLLM_SHORT_FLAGS:  # -tp 2, -tp=2
            arg = f"--{VLLM_SHORT_FLAGS[short]}{sep}{rest}"
        if arg in HYDRA_VALUE_FLAGS:
            i += 1 if takes_value else 0
        elif arg.startswith("--") and arg.split("=", 1)[0] not in HYDRA_FLAGS:
            flag, _, value = arg[2:].partition("=")
            if not value and takes_value:
                value, i = following, i + 1
            hints.append(f"--{flag}{' ' + value if value else ''} -> {_override(flag.replace('-', '_'), value)}")
        elif not arg.startswith(("-", "~")) and "=" not in arg:
            hints.append(f"{arg} -> {SUBCOMMANDS.get(arg, f'model.path={arg}')}")
    if not hints:
        return None
    return (
        "settings are Hydra overrides (key=value), not vLLM's command line: "
        + "; ".join(hints)
        + " (python -m minivllm --help lists the groups, docs/CONFIG.md every key)"
    )


def _override(name: str, value: str) -> str:
    negated = name.startswith("no_") and name[3:] in KWARG_KEYS
    if negated:
        return f"{KWARG_KEYS[name[3:]]}=false"
    if name in FLAG_OVERRIDES:
        return FLAG_OVERRIDES[name]
    key = SERVE_FLAG_KEYS.get(name) or KWARG_KEYS.get(name)
    if name in NOT_IMPLEMENTED:
        return f"not implemented ({NOT_IMPLEMENTED[name]})"
    if key is None:
        return "no such setting"
    return f"{key}={value or 'true'}"
