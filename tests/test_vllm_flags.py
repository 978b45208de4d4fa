"""vLLM's flags on our command line: one line naming the override for each."""

from __future__ import annotations

import sys

import pytest

from minivllm.cli.main import flag_hint, main


def test_each_flag_is_answered_with_its_override():
    hint = flag_hint(
        ["task=serve", "--model", "/ckpts/x", "--port=8001", "--tensor-parallel-size", "2", "--enforce-eager"]
        + ["--no-enable-prefix-caching", "--max-model-len", "4096", "--swap-space", "4", "--no-such-flag"]
        + ["-m", "cache.block_size=8"]
    )
    assert hint is not None and "\n" not in hint
    for pair in [
        "--model /ckpts/x -> model.path=/ckpts/x",
        "--port 8001 -> serve.port=8001",
        "--tensor-parallel-size 2 -> parallel.tp=2",
        "--enforce-eager -> compilation.cudagraph=false",
        "--no-enable-prefix-caching -> cache.enable_prefix_caching=false",
        "--max-model-len 4096 -> model.max_model_len=4096",
        "--swap-space 4 -> not implemented (preemption recomputes",
        "--no-such-flag -> no such setting",
    ]:
        assert pair in hint
    assert "cache.block_size=8 ->" not in hint


def test_vllm_serve_model_is_answered_with_task_and_model_path():
    hint = flag_hint(["serve", "Qwen/Qwen3-0.6B", "--port", "8001"])
    assert hint is not None
    assert "serve -> task=serve; Qwen/Qwen3-0.6B -> model.path=Qwen/Qwen3-0.6B; --port 8001 -> serve.port=8001" in hint


def test_vllm_short_flags_are_answered_as_their_long_forms():
    hint = flag_hint(["serve", "/ckpts/x", "-tp", "2", "-pp=2", "-q", "awq"])
    assert hint is not None
    for pair in ["--tensor-parallel-size 2 -> parallel.tp=2", "--pipeline-parallel-size 2 -> parallel.pp=2"]:
        assert pair in hint
    assert "--quantization awq -> model.quantization=awq" in hint
    assert "model.path=2" not in hint and "model.path=awq" not in hint


def test_hydras_own_flags_and_plain_overrides_pass():
    args = ["--cfg", "job", "-m", "--config-dir=x", "--config-name", "best", "-cd", "d", "serve.port=1", "~plugins"]
    assert flag_hint(args) is None


def test_the_command_line_exits_with_the_hint(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["minivllm", "task=serve", "--port", "8000"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: settings are Hydra overrides") and "serve.port=8000" in err[0]
