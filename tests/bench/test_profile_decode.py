"""benchmarks/profile_decode.py --tiny: a real engine profiled on the CPU, its sampler told apart."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_decode.py"


def _load():
    spec = importlib.util.spec_from_file_location("profile_decode", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_profile_groups_a_full_batch_decode(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert _load().main(["--tiny", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["batch"] == 4 and summary["steps"] == 3 and summary["cudagraph"] is False
    assert summary["prefill_steps"] >= 1 and summary["step_ms"] > 0
    groups = summary["groups"]
    assert sum(g["percent"] for g in groups.values()) == pytest.approx(100)
    assert all(groups[g]["ms_per_step"] > 0 for g in ("attention", "gemm", "sampler", "small ops"))
    assert {k["group"] for k in summary["top"]} >= {"gemm", "small ops"}
    assert "sampler" in capsys.readouterr().out


def test_a_batch_above_max_num_seqs_is_refused_before_the_engine_starts(capsys):
    assert _load().main(["--tiny", "--batch", "8", "--", "scheduler.max_num_seqs=4"]) == 2
    assert "--batch 8: more than scheduler.max_num_seqs=4" in capsys.readouterr().err
