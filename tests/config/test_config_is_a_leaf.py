"""The config describes and never builds: importing ``minivllm.config`` and building a
config import nothing from the engine's packages (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ENGINE_PACKAGES = (
    "core",
    "engine",
    "executor",
    "worker",
    "models",
    "model_loader",
    "layers",
    "attention",
    "lora",
    "spec_decode",
    "sample",
    "structured_output",
    "pooling",
    "serve",
    "entrypoints",
    "bench",
    "data_parallel",
    "distributed",
    "plugins",
    "quantization",
)
ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import minivllm.config
after_import = sorted(m for m in sys.modules if m.startswith("minivllm."))
from minivllm.config import build_config, config_from_kwargs, VllmConfig
cfg = build_config(["model=opt-125m", "load.format=dummy", "speculative=ngram"])
VllmConfig.from_dictconfig(config_from_kwargs(sys.argv[1], dtype="float32", quantization="fp8"))
print(json.dumps({"import": after_import, "build": sorted(m for m in sys.modules if m.startswith("minivllm."))}))
"""


def _engine_modules(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[1] in ENGINE_PACKAGES]


def test_config_imports_and_builds_without_the_engine(llama_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(llama_dir)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "minivllm.config.vllm_config" in loaded["import"]  # the probe saw the config's own modules
    assert _engine_modules(loaded["import"]) == []
    assert _engine_modules(loaded["build"]) == []
