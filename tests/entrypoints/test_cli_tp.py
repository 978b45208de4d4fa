"""``python -m minivllm parallel.tp=2 ...`` end to end, as a user runs it: the same
tokens as tp=1, the resolved config naming the executor, and no process left
behind when the CLI ends or is interrupted (Ctrl-C)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.executor import tp_helpers as h

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TAG_KEY = "MINIVLLM_TEST_RUN"


def _cli(ckpt: Path, out_dir: Path, prompts_file: Path, *extra: str) -> tuple[list[str], dict[str, str]]:
    cmd = [
        sys.executable,
        "-m",
        "minivllm",
        f"model.path={ckpt}",
        "model.dtype=float32",
        "model.max_model_len=128",
        "parallel.tp=2",
        "cache.block_size=8",
        "cache.num_gpu_blocks_override=64",
        f"prompts_file={prompts_file}",
        "sampling.temperature=0",
        f"hydra.run.dir={out_dir}",
        *extra,
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        TAG_KEY: uuid.uuid4().hex,
    }
    return cmd, env


def _sigint_as_in_a_terminal() -> None:
    """A command run from a terminal gets Ctrl-C; one started in the background by a
    non-interactive shell (as a test runner may be) inherits SIGINT ignored, and Python
    keeps it ignored. Give the CLI the terminal's default, which is what this test is about."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _write_prompts(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


@pytest.mark.timeout(180)
def test_cli_tp2_generates_tp1_tokens(opt_dir, tmp_path):
    prompts = _write_prompts(tmp_path / "prompts.jsonl", h.PROMPTS)
    cmd, env = _cli(opt_dir, tmp_path / "run", prompts, f"sampling.max_tokens={h.GREEDY.max_tokens}")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "outputs.jsonl").read_text().splitlines()]
    assert [r["token_ids"] for r in records] == [o.outputs[0].token_ids for o in h.reference(opt_dir)]
    resolved = yaml.safe_load((tmp_path / "run" / "resolved_config.yaml").read_text())
    assert resolved["parallel"]["executor"]["_target_"] == "minivllm.executor.multiproc.MultiprocExecutor"
    assert resolved["parallel"]["tp"] == 2
    assert h.wait_until(lambda: not h.pids_with_env(TAG_KEY, env[TAG_KEY]), timeout=5)


@pytest.mark.timeout(180)
def test_ctrl_c_leaves_no_worker_behind(opt_dir, tmp_path):
    prompts = _write_prompts(tmp_path / "prompts.jsonl", [f"x{i}" for i in range(400)])
    cmd, env = _cli(opt_dir, tmp_path / "run", prompts, "sampling.max_tokens=110", "+sampling.ignore_eos=true")
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_sigint_as_in_a_terminal,
    )
    try:
        log = []
        for line in proc.stdout:  # the engine logs its KV cache size once the workers are up
            log.append(line)
            if "KV cache:" in line:
                break
        workers = h.pids_with_env(TAG_KEY, env[TAG_KEY], with_tracker=False) - {proc.pid}
        assert len(workers) == 2, "".join(log)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0  # interrupted mid-generation, not finished
    assert h.wait_until(lambda: not h.pids_with_env(TAG_KEY, env[TAG_KEY]), timeout=10)
