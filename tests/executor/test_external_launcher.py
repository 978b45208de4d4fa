"""parallel.backend=external_launcher: under ``torchrun --nproc-per-node 2`` (tp=2,
one engine per process) the example script's outputs equal tp=1's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minivllm import LLM
from tests.executor import tp_helpers as h

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "torchrun_external_launcher.py"
OVERRIDES = ["model.dtype=float32", "cache.block_size=8", "cache.num_gpu_blocks_override=64", "model.max_model_len=128"]


def _torchrun() -> list[str]:
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.exists() else [shutil.which("torchrun") or "torchrun"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tp2_under_torchrun_equals_tp1(opt_dir, tmp_path):
    out = tmp_path / "outputs.json"
    cmd = [
        *_torchrun(),
        "--standalone",
        "--nproc-per-node",
        "2",
        str(EXAMPLE),
        "--model",
        str(opt_dir),
        "--max-tokens",
        str(h.GREEDY.max_tokens),
        "--logprobs",
        str(h.GREEDY.logprobs),
        "--out",
        str(out),
    ]
    cmd += [arg for o in OVERRIDES for arg in ("--override", o)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=220)
    assert run.returncode == 0, run.stderr[-4000:]
    records = json.loads(out.read_text())
    reference = h.reference(opt_dir)
    assert [r["prompt"] for r in records] == h.PROMPTS
    for rec, ref in zip(records, reference, strict=True):
        assert rec["token_ids"] == ref.outputs[0].token_ids, rec["prompt"]
        for got, want in zip(rec["logprobs"], ref.outputs[0].logprobs, strict=True):
            assert {int(t): v for t, v in got.items()} == pytest.approx(want, abs=1e-4)


def test_outside_a_launcher_is_a_clear_error(opt_dir, monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match=r"parallel.backend=external_launcher: RANK, WORLD_SIZE.* not set; .*torchrun"):
        LLM(
            model=str(opt_dir), tensor_parallel_size=2, distributed_executor_backend="external_launcher", **h.LLM_KWARGS
        )


def test_a_world_size_that_disagrees_is_refused(opt_dir, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    with pytest.raises(ValueError, match=r"WORLD_SIZE=3 processes, but parallel.tp x parallel.pp = 2"):
        LLM(
            model=str(opt_dir), tensor_parallel_size=2, distributed_executor_backend="external_launcher", **h.LLM_KWARGS
        )
