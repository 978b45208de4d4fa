"""Multirun sweeps: every job runs, failures are recorded, summary.csv / summary.png are written."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from minivllm.bench.sweep import collect, write_summary

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _fake_job(sweep: Path, name: str, overrides: list[str], metrics: dict | None) -> None:
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if metrics is not None:
        (job / "metrics.json").write_text(json.dumps(metrics))


def test_summary_of_job_folders(tmp_path):
    ok = {"status": "ok", "output_tokens_per_s": 10.0, "num_preemptions": 2, "num_kv_blocks": 7}
    _fake_job(tmp_path, "0", ["task=bench", "cache.block_size=8"], ok)
    _fake_job(
        tmp_path, "1", ["task=bench", "cache.block_size=16"], {"status": "failed", "error": "ValueError: no room"}
    )
    _fake_job(tmp_path, "2", ["task=bench", "cache.block_size=32"], None)  # killed before writing metrics
    _fake_job(tmp_path, "10", ["task=bench", "cache.block_size=64"], {**ok, "output_tokens_per_s": 12.5})
    swept, rows = collect(tmp_path)
    assert swept == ["cache.block_size"]  # task=bench is the same in every job
    assert [r["job"] for r in rows] == ["0", "1", "2", "10"]  # numeric order, not "10" < "2"
    assert [r["status"] for r in rows] == ["ok", "failed", "missing", "ok"]
    table = write_summary(tmp_path)
    assert "job 1 failed: ValueError: no room" in table
    with open(tmp_path / "summary.csv") as f:
        written = list(csv.DictReader(f))
    assert [r["cache.block_size"] for r in written] == ["8", "16", "32", "64"]
    assert [r["output_tokens_per_s"] for r in written] == ["10.0", "", "", "12.5"]
    assert (tmp_path / "summary.png").read_bytes().startswith(PNG_MAGIC)


def test_multirun_sweep_records_failures_and_writes_summary(opt_dir, tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "minivllm",
        "-m",
        "task=bench",
        f"model.path={opt_dir}",
        "bench.num_prompts=4",
        "bench.min_input_len=4",
        "bench.max_input_len=16",
        "bench.min_output_len=2",
        "bench.max_output_len=6",
        "bench.single_request=false",
        "bench.warmup=false",
        # 2 blocks of 8 tokens cannot hold the 18-token request: that job fails, the sweep goes on
        "cache.block_size=8,16",
        "cache.num_gpu_blocks_override=32,2",
        f"hydra.sweep.dir={sweep}",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    by_key = {(r["cache.block_size"], r["cache.num_gpu_blocks_override"]): r for r in rows}
    assert set(by_key) == {("8", "32"), ("16", "32"), ("8", "2"), ("16", "2")}
    failed = by_key[("8", "2")]
    assert failed["status"] == "failed" and "can never fit the KV cache" in failed["error"]
    for key in [("8", "32"), ("16", "32"), ("16", "2")]:
        assert by_key[key]["status"] == "ok" and float(by_key[key]["output_tokens_per_s"]) > 0
    assert [by_key[k]["num_kv_blocks"] for k in [("8", "32"), ("16", "32"), ("16", "2")]] == ["32", "32", "2"]
    assert (sweep / "summary.png").read_bytes().startswith(PNG_MAGIC)
    assert "sweep summary" in proc.stdout and f"job {failed['job']} failed: ValueError" in proc.stdout
