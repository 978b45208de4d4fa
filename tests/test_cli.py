"""The command line, run as a user would: in a subprocess, in a temp directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def run_cli(args: list[str], cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "minivllm", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_generate_writes_outputs_and_metrics(llama_dir, tmp_path):
    result = run_cli(
        [
            f"model.path={llama_dir}",
            "sampling.max_tokens=5",
            "+sampling.ignore_eos=true",
            "prompts=['def f():','import os']",
            "cache.num_gpu_blocks_override=32",
            "hydra.run.dir=run",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "run"
    records = [json.loads(line) for line in (run_dir / "outputs.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == ["def f():", "import os"]
    assert all(len(r["token_ids"]) == 5 for r in records)
    assert records[0]["text"] in result.stdout
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["output_tokens"] == 10 and metrics["num_kv_blocks"] == 32
    assert metrics["output_tokens_per_s"] > 0 and metrics["num_preemptions"] == 0
    resolved = yaml.safe_load((run_dir / "resolved_config.yaml").read_text())
    assert resolved["parallel"]["executor"]["_target_"] == "minivllm.executor.base.UniProcExecutor"


def test_multirun_runs_one_job_per_combination(llama_dir, tmp_path):
    result = run_cli(
        [
            "-m",
            f"model.path={llama_dir}",
            "sampling.max_tokens=3",
            "prompts=[x]",
            "cache.block_size=8,16",
            "cache.cpu_memory_gb=0.5",
            "hydra.sweep.dir=sweep",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    jobs = sorted((tmp_path / "sweep").glob("*/metrics.json"))
    assert len(jobs) == 2
    sizes = sorted(json.loads(j.read_text())["block_size"] for j in jobs)
    assert sizes == [8, 16]


def test_config_error_is_one_line_without_a_trace(llama_dir, tmp_path):
    result = run_cli([f"model.path={llama_dir}", "cache.block_size=12", "hydra.run.dir=run"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: cache.block_size=12")
    assert "Traceback" not in result.stderr


def test_compose_works_from_an_installed_wheel(tmp_path):
    """The conf/ tree ships inside the wheel: compose() needs no checkout."""
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheel_dir),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    wheel = next(wheel_dir.glob("minivllm-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        timeout=300,
    )
    code = (
        "import minivllm, sys; assert 'site' in minivllm.__file__, minivllm.__file__;"
        "a = minivllm.compose(['model=opt-125m', 'cache.block_size=8']);"
        "b = minivllm.compose(['cache.block_size=32']);"
        "print(a.model.path, a.cache.block_size, b.cache.block_size)"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["facebook/opt-125m", "8", "32"]


def test_help_lists_every_config_group_and_examples(tmp_path):
    result = run_cli(["--help"], tmp_path, timeout=60)
    assert result.returncode == 0
    conf = ROOT / "conf"
    groups = sorted(p.name for p in conf.iterdir() if p.is_dir() and list(p.glob("*.yaml")))
    for group in groups:
        options = ", ".join(sorted(p.stem for p in (conf / group).glob("*.yaml")))
        assert f"{group}: {options}" in result.stdout
    assert result.stdout.count("python -m minivllm ") >= 3
    assert "python -m minivllm model.path=" in result.stdout  # where a checkpoint goes


def test_user_errors_are_one_line_naming_the_key(llama_dir, tmp_path):
    """Each mistake a user can make by config or input: exit code 2, one line that
    names the key or field, no traceback."""
    cases = {
        "sampling.temperature=-1": "temperature",
        "+sampling.top_k=-5": "top_k",
        "+sampling.bogus=1": "sampling",
        "prompts=['']": "prompt: '' tokenizes to no tokens",  # the tests' tokenizer adds no BOS token
        "model.max_model_len=100000": "model.max_model_len",
        "parallel.tp=3": "parallel.tp",
        "prompts_file=/no/such/file.txt": "prompts_file",
    }
    for override, key in cases.items():
        result = run_cli([f"model.path={llama_dir}", override, "hydra.run.dir=run"], tmp_path, timeout=120)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (override, result.stderr)
        assert "Traceback" not in result.stderr, override
        assert lines[-1].startswith("error: ") and key in lines[-1], (override, lines[-1])


def test_a_checkpoint_path_as_the_model_group_is_one_line_naming_model_path(monkeypatch, capsys):
    """vLLM's ``--model PATH`` becomes ``model=PATH`` in a vLLM user's hands: answered
    before Hydra (whose error would be a missing ``model//PATH`` config)."""
    from minivllm.cli.main import main

    monkeypatch.setattr(sys, "argv", ["minivllm", "model=/ckpts/llama-3-8b", "sampling.max_tokens=4"])
    with pytest.raises(SystemExit) as exit_:
        main()
    presets = ", ".join(sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")))
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: model=/ckpts/llama-3-8b: not a model preset ({presets}); "
        "a checkpoint directory, .gguf file or hub id goes in model.path: model.path=/ckpts/llama-3-8b"
    ]
