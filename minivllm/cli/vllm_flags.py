"""vLLM's command line, answered with the Hydra overrides that do the same.

``vllm serve MODEL --port 8000 --max-model-len 4096`` is in every vLLM user's
fingers; here the same settings are Hydra overrides (``task=serve model.path=MODEL
serve.port=8000``), and argparse or Hydra would only say ``unrecognized arguments`` or
``missing EQUAL``. ``flag_hint`` turns the flags, subcommand and model of one command
line into a single line that names each one's override, so the corrected command can
be read off it. The flags are not translated silently: the
config tree stays the one way to say what a run does.
"""

from __future__ import annotations

from typing import Sequence

from minivllm.config.llm_kwargs import KWARG_KEYS, NOT_IMPLEMENTED

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
