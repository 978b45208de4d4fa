"""A real tuning run on the demo model: 4 trials (one cannot start), the report, the resume,
a latency target set from the first run's measurements, and best.yaml in use."""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path
from unittest import mock

import optuna
import pytest
from omegaconf import OmegaConf

from minivllm.cli.main import main
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams
from minivllm.tune import load_tuned

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = [
    "bench.num_prompts=4",
    "bench.prefix_len=16",
    "bench.min_input_len=8",
    "bench.max_input_len=16",
    "bench.min_output_len=4",
    "bench.max_output_len=8",
    "bench.request_rate=inf",
    "bench.warmup=false",
    "bench.progress=false",
    # 0.0001 of the memory leaves no room for the KV cache: those trials cannot start
    "cache.gpu_memory_utilization=choice(0.0001,0.9)",
]


def _tune(sweep: Path, *extra: str) -> list[dict[str, str]]:
    """``python -m minivllm -m +tune=serving ...`` in this process (its trials run here too)."""
    argv = ["minivllm", "-m", "+tune=serving", *TINY, f"hydra.sweep.dir={sweep}", *extra]
    with mock.patch.object(sys, "argv", argv):
        main()
    with open(sweep / "trials.csv") as f:
        return list(csv.DictReader(f))


def _ok(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [r for r in rows if r["state"] == "complete"]


@pytest.mark.slow
def test_tune_reports_resumes_and_chooses_a_config_that_meets_the_target(tmp_path):
    sweep = tmp_path / "sweep"
    rows = _tune(sweep, "tune.trials=4")
    assert [r["trial"] for r in rows] == ["0", "1", "2", "3"]
    failed = [r for r in rows if r["state"] == "failed"]
    assert failed and all("leaves no room for the KV" in r["error"] for r in failed)  # reported, the sweep went on
    assert len(_ok(rows)) >= 2 and all(float(r["output_tokens_per_s"]) > 0 for r in _ok(rows))
    for name in ("best.yaml", "trials.md", "study.db"):
        assert (sweep / name).is_file()
    for name in ("pareto.png", "importance.png"):
        assert (sweep / name).read_bytes().startswith(PNG_MAGIC)

    # A target between the configs measured: the median p99 TTFT of those that ran.
    target = statistics.median(float(r["ttft_p99_ms"]) for r in _ok(rows))
    rows = _tune(sweep, "tune.trials=5", f"tune.slo.ttft_p99_ms={target}")
    study = optuna.load_study(study_name="minivllm-tune", storage=f"sqlite:///{sweep}/study.db")
    assert len(study.trials) == 5 and [r["trial"] for r in rows] == ["0", "1", "2", "3", "4"]  # one more, not 5

    ran = _ok(rows)
    meets = [r for r in ran if float(r["ttft_p99_ms"]) <= target]
    assert meets and len(meets) < len(ran)  # the target separates the configs
    assert all(r["feasible"] == str(r in meets) for r in ran)
    chosen = max(meets, key=lambda r: float(r["output_tokens_per_s"]))
    best = OmegaConf.load(sweep / "best.yaml")
    sampled = [k for k in rows[0] if k.startswith(("scheduler.", "cache."))]
    for key in sampled:  # best.yaml holds the chosen trial's keys
        assert str(OmegaConf.select(best, key)) == chosen[key], key
    assert f"trial {chosen['trial']} " in (sweep / "best.yaml").read_text().splitlines()[0]

    # best.yaml in use: the same greedy tokens as the default config (the knobs change speed, not results)
    tuned = load_tuned(sweep / "best.yaml")
    assert [str(OmegaConf.select(tuned.to_dictconfig(), k)) for k in sampled] == [chosen[k] for k in sampled]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    outputs = []
    for cfg in (tuned, load_tuned(sweep / "best.yaml", [f"{k}={v}" for k, v in _defaults(sampled).items()])):
        llm = LLM.from_config(cfg)
        outputs.append(llm.generate(["def fibonacci(n):"], params)[0].outputs[0].token_ids)
        llm.shutdown()
    assert len(outputs[0]) == 8 and outputs[0] == outputs[1]


def _defaults(keys: list[str]) -> dict[str, str]:
    from minivllm.config.store import build_config

    default = build_config().to_dictconfig()
    return {k: "null" if OmegaConf.select(default, k) is None else OmegaConf.select(default, k) for k in keys}


def test_tuning_without_multirun_or_with_targets_but_no_latencies_is_refused(tmp_path, capsys):
    with mock.patch.object(sys, "argv", ["minivllm", "+tune=serving", f"hydra.run.dir={tmp_path / 'run'}"]):
        with pytest.raises(SystemExit):
            main()
    assert "run it with -m" in capsys.readouterr().err
    sweep = tmp_path / "sweep"
    argv = [
        "minivllm",
        "-m",
        "+tune=serving",
        "bench.mode=throughput",
        "tune.slo.itl_p99_ms=5",
        f"hydra.sweep.dir={sweep}",
    ]
    with mock.patch.object(sys, "argv", argv):
        with pytest.raises(SystemExit):
            main()
    assert "latency targets need bench.mode=serving" in capsys.readouterr().err
    assert not sweep.exists()  # refused before the sweep began
