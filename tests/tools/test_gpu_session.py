"""tools/gpu_session.sh tried on the CPU: a fake nvidia-smi, GPU_SESSION_CPU_TRY=1, a temp $OUT."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tools.gpu_session import vlm_graphs
from tools.gpu_session.results_md import load_stages, render
from tools.gpu_session.stage_metrics import multimodal_metrics
from tools.gpu_session.summary import key_numbers

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_session.sh"


def _session(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    smi = fake / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04"\n')
    smi.chmod(0o755)
    full_env = {
        **os.environ,
        "PATH": f"{fake}:{os.environ['PATH']}",
        "PYTHON": sys.executable,
        "OUT": str(tmp_path / "out"),
        "GPU_SESSION_WORK": str(tmp_path / "work"),
        "GPU_SESSION_CPU_TRY": "1",
        "OMP_NUM_THREADS": "1",
        **env,
    }
    return subprocess.run(["bash", str(SCRIPT), *args], env=full_env, capture_output=True, text=True, timeout=240)


def test_cpu_try_records_a_failed_stage_and_goes_on(tmp_path):
    proc = _session(tmp_path, "--stages", "a,c,d4", GPU_SESSION_FAIL_STAGES="c")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["session.tar.gz", "summary.json", "summary.txt"]
    stages = json.loads((out / "summary.json").read_text())["stages"]
    assert [(s["stage"], s["status"]) for s in stages] == [("a", "ok"), ("c", "failed"), ("d4", "ok")]
    env, failed, attention = (s["metrics"] for s in stages)
    assert env["gpu"]["nvidia_smi"].startswith("NVIDIA H100") and env["gpu"]["skipped"].startswith("CPU try")
    assert env["conf"]["composes"] and env["launcher_toolchain"]["python_h"].endswith("Python.h")
    assert failed["rc"] == 3 and "no metrics" in stages[1]["key_numbers"]
    assert attention["rows"] and all(r["max |diff|"] < 0.05 for r in attention["rows"])
    assert {r["num_reqs"] for r in attention["rows"] if r["query_len"] == 1} == {1, 2}
    with tarfile.open(out / "session.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"work/a/log.txt", "work/c/log.txt", "work/d4/metrics.json"} <= names
    table = proc.stdout.splitlines()
    assert table[-5].startswith("stage") and table[-3].split()[:2] == ["c", "demo:"]
    draft = render(load_stages([out / "summary.json"]), "2026-11-23")
    assert "| decode 2x64 |" in draft and "| prefill 2x16@48 |" in draft


def test_results_draft_has_one_row_per_configuration(tmp_path):
    row = dict(
        status="ok",
        output_tokens_per_s=18000.0,
        roofline_percent=71.5,
        decode_roofline_percent=80.0,
        num_preemptions=0,
        num_kv_blocks=1200,
        single_decode_tokens_per_s=400.0,
        speedup_vs_hf=None,
        hf_output_tokens_per_s=None,
    )
    d1 = {"runs": [dict(row, run="graphs"), {"run": "eager", "status": "no metrics"}]}
    d3 = {"runs": [dict(row, run="hf_vs_minivllm", speedup_vs_hf=16.0, hf_output_tokens_per_s=1125.0)]}
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"stages": [{"stage": "d1", "metrics": d1}, {"stage": "d3", "metrics": d3}]}))
    lines = render(load_stages([summary]), "2026-11-24").splitlines()
    assert lines[0] == "## GPU session: GPU (name not recorded), 2026-11-24"
    rows = [line for line in lines if line.startswith("| `")]
    assert (
        rows[0]
        == "| `(defaults: CUDA graphs, async scheduling)` | 18000 | 71.5 (80.0) | n/a of n/a | 0 | 1200 | 400 |  |"
    )
    assert rows[1].startswith("| `compilation.cudagraph=false` | no metrics |")
    assert rows[2].endswith("| 16.0x (transformers 1125 tok/s) |")


def test_bench_runs_of_later_calls_merge_by_name_and_are_labelled_by_their_overrides(tmp_path):
    """One session may run graphs in one call and eager in the next: both rows stay. The label
    is what Hydra recorded, the base command's keys left out and a repeated key's last value kept."""
    base = ["task=bench", "bench=nanovllm", "model=qwen3-0.6b", "load.format=dummy", "bench.progress=false"]
    row = dict(
        status="ok",
        output_tokens_per_s=1.0,
        roofline_percent=1.0,
        num_preemptions=0,
        num_kv_blocks=1,
        single_decode_tokens_per_s=1.0,
        prefill_step_time_s=0.5,
        total_time_s=2.0,
    )
    first = {"runs": [dict(row, run="graphs", overrides=base + ["hydra.run.dir=/x"], output_tokens_per_s=100.0)]}
    second = {
        "runs": [
            dict(row, run="eager", overrides=base + ["compilation.cudagraph=false"], output_tokens_per_s=50.0),
            dict(row, run="hf", overrides=base + ["bench.num_prompts=32", "bench.num_prompts=16"]),
        ]
    }
    paths = []
    for i, d1 in enumerate((first, second)):
        paths.append(tmp_path / f"summary{i}.json")
        paths[-1].write_text(json.dumps({"stages": [{"stage": "d1", "metrics": d1}]}))
    rows = [line for line in render(load_stages(paths), "2026-11-26").splitlines() if line.startswith("| `")]
    assert rows[0].startswith("| `(defaults: CUDA graphs, async scheduling)` | 100 | 1.0 (n/a) | 0.50 of 2.00 |")
    assert rows[1].startswith("| `compilation.cudagraph=false` | 50 |")
    assert rows[2].startswith("| `bench.num_prompts=16` |")


def test_kernel_stage_and_chosen_bench_runs_on_the_cpu(tmp_path):
    """d6 writes both kernel benchmarks' rows; GPU_SESSION_RUNS_D1 picks the bench runs."""
    proc = _session(
        tmp_path, "--stages", "d1,d6", GPU_SESSION_RUNS_D1="sync", GPU_SESSION_BENCH_ARGS="bench.single_request=false"
    )
    assert proc.returncode == 0, proc.stderr
    d1, d6 = (s["metrics"] for s in json.loads((tmp_path / "out" / "summary.json").read_text())["stages"])
    assert [r["run"] for r in d1["runs"]] == ["sync"] and d1["runs"][0]["status"] == "ok"
    assert "scheduler.async_scheduling=false" in d1["runs"][0]["overrides"]
    assert "bench.single_request=false" in d1["runs"][0]["overrides"]
    assert d6["status"] == "ok" and d6["moe"]["rows"] and d6["quant_gemm"]["rows"]
    draft = render(load_stages([tmp_path / "out" / "summary.json"]), "2026-11-26")
    assert "Fused MoE (`benchmarks/moe.py`)" in draft and "Quantized GEMMs (`benchmarks/quant_gemm.py`)" in draft
    fp8_quant = d6["quant_gemm"]["fp8_quant_rows"]  # the kernel through the interpreter, against torch
    assert fp8_quant and all(r["same_bits"] for r in fp8_quant)
    assert "fp8 activation quantization (`benchmarks/quant_gemm.py`)" in draft


def test_image_model_stage_on_the_cpu(tmp_path):
    """d7 at a tiny Qwen2-VL shape: a directory without weights on dummy weights, images at its
    native size; images/s, tok/s and the encoder's share reach metrics.json, the summary and the draft."""
    proc = _session(tmp_path, "--stages", "d7", GPU_SESSION_RUNS_D7="qwen2_vl")
    assert proc.returncode == 0, proc.stderr
    (stage,) = json.loads((tmp_path / "out" / "summary.json").read_text())["stages"]
    assert stage["status"] == "ok", stage
    (run,) = stage["metrics"]["runs"]
    assert run["run"] == "tiny-qwen2-vl" and run["architecture"] == "Qwen2VLForConditionalGeneration"
    assert run["images"] == run["images_encoded"] == 4 and run["images_per_s"] > 0 and 0 < run["encoder_percent"] < 100
    assert "bench.image_size=56" in run["overrides"] and "load.format=dummy" in run["overrides"]
    checkpoint = tmp_path / "work" / "d7" / "checkpoints" / "tiny-qwen2-vl"
    assert (checkpoint / "config.json").is_file() and not list(checkpoint.glob("*.safetensors"))
    assert stage["key_numbers"].startswith("tiny-qwen2-vl: ") and "images/s" in stage["key_numbers"]
    draft = render(load_stages([tmp_path / "out" / "summary.json"]), "2026-11-26")
    assert "| tiny-qwen2-vl | `device=cpu " in draft and "bench.image_size=56" in draft


def test_the_image_models_graphs_vs_eager_check_reports_a_difference(tmp_path, tokenizer_dir):
    """d7's text check on the CPU (no graphs there: the same tokens, and it says none were
    captured); one token changed in a run's outputs is reported at its position."""
    assert vlm_graphs.main([str(tmp_path), "--tokenizer", str(tokenizer_dir)]) == 0
    check = multimodal_metrics(tmp_path, [])["graphs_vs_eager"]
    assert check["same_text"] and check["cuda_graphs_captured"] is False and check["num_prompts"] == [4, 4]
    lines = (tmp_path / "vlm_eager" / "outputs.jsonl").read_text().splitlines()
    row = json.loads(lines[2])
    row["token_ids"][5] += 1
    (tmp_path / "vlm_eager" / "outputs.jsonl").write_text("\n".join([*lines[:2], json.dumps(row), *lines[3:]]))
    metrics = multimodal_metrics(tmp_path, [])
    assert not metrics["ok"]
    assert [(m["prompt"], m["first_different_token"]) for m in metrics["graphs_vs_eager"]["mismatches"]] == [(2, 5)]
    assert "graphs vs eager same text: NO" in key_numbers("d7", metrics)


def test_a_stage_past_its_limit_is_recorded_as_a_timeout(tmp_path):
    proc = _session(tmp_path, "--stages", "d4", GPU_SESSION_TIMEOUT_D4="2")
    assert proc.returncode == 0, proc.stderr
    (stage,) = json.loads((tmp_path / "out" / "summary.json").read_text())["stages"]
    assert stage["status"] == "timeout" and stage["metrics"]["rc"] == 124 and stage["seconds"] < 20


def test_an_unknown_stage_is_refused_before_any_work(tmp_path):
    proc = _session(tmp_path, "--stages", "a,e")
    assert proc.returncode == 2
    assert "unknown stage 'e'" in proc.stderr and not (tmp_path / "work").exists()


def test_a_missing_package_skips_its_tests_and_a_missing_project_module_still_fails(tmp_path, capsys):
    (tmp_path / "test_needs_pkg.py").write_text("import surely_not_installed_pkg\n\ndef test_x():\n    pass\n")
    (tmp_path / "test_inside.py").write_text(
        "def test_pkg():\n    import surely_not_installed_pkg.sub\n\n"
        "def test_project():\n    import minivllm.surely_not_a_module\n\n"
        "def test_fine():\n    assert 1 + 1 == 2\n"
    )
    code = pytest.main(
        [
            "-q",
            "-rfs",
            "-p",
            "tools.gpu_session.skip_missing",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == pytest.ExitCode.TESTS_FAILED
    assert "1 failed, 1 passed, 2 skipped" in out, out
    assert "needs surely_not_installed_pkg, which is not installed" in out
    assert "E       ModuleNotFoundError: No module named 'minivllm.surely_not_a_module'" in out


def test_core_runs_its_stages_in_the_issue_order_within_one_call(tmp_path):
    """--core: environment, nano-vllm's instance (defaults, sync), nano-vllm itself, the profile, the
    microbenchmarks; limits that fit a ~570 s call. Every stage fails on purpose here: only the plan."""
    proc = _session(tmp_path, "--core", GPU_SESSION_FAIL_STAGES="a n1 n2 p m")
    assert proc.returncode == 0, proc.stderr
    stages = json.loads((tmp_path / "out" / "summary.json").read_text())["stages"]
    assert [s["stage"] for s in stages] == ["a", "n1", "n2", "p", "m"]
    limits = [int(line.split("limit ")[1].split("s,")[0]) for line in proc.stdout.splitlines() if "limit " in line]
    assert len(limits) == 5 and sum(limits) <= 545
    proc = _session(tmp_path, "--correctness", GPU_SESSION_FAIL_STAGES="b c")
    assert [s["stage"] for s in json.loads((tmp_path / "out" / "summary.json").read_text())["stages"]] == ["b", "c"]


def test_core_bench_stages_run_on_the_cpu(tmp_path):
    """n1 replays an instance file through bench.workload=jsonl with the defaults, with sync
    scheduling and (asked for) with multi-step decoding (the CPU try: a toy instance the shrunken
    model can take), each with its floor; n2 says it needs CUDA."""
    proc = _session(tmp_path, "--stages", "n1,n2", GPU_SESSION_RUNS_N1="graphs sync multistep")
    assert proc.returncode == 0, proc.stderr
    stages = {s["stage"]: s for s in json.loads((tmp_path / "out" / "summary.json").read_text())["stages"]}
    assert (stages["n1"]["status"], stages["n2"]["status"]) == ("ok", "ok"), proc.stdout
    runs = {r["run"]: r for r in stages["n1"]["metrics"]["runs"]}
    assert set(runs) == {"graphs", "sync", "multistep"}
    for r in runs.values():
        assert r["status"] == "ok" and r["num_requests"] == 4
        assert "bench.workload=jsonl" in r["overrides"]
        assert r["floor_output_tokens_per_s"] > 0 and r["gemm_tflop_s"] > 0
        assert r["prefill_measured_s"] > 0 and r["decode_measured_s"] > 0
    assert "scheduler.async_scheduling=false" in runs["sync"]["overrides"]
    assert "scheduler.num_scheduler_steps=8" in runs["multistep"]["overrides"]
    assert "needs CUDA" in stages["n2"]["key_numbers"]


def _core_summaries(tmp_path: Path) -> list[Path]:
    run = dict(
        status="ok",
        output_tokens_per_s=20000.0,
        roofline_percent=55.9,
        floor_output_tokens_per_s=35800.0,
        copy_bandwidth_gb_s=4250.0,
        gemm_tflop_s=780.0,
        roofline_floor_s=3.74,
        prefill_floor_s=0.18,
        prefill_measured_s=0.9,
        decode_measured_s=5.8,
        single_decode_tokens_per_s=820.0,
    )
    n1 = {
        "runs": [
            dict(run, run="graphs", overrides=["bench.workload=jsonl", "bench.prompts_file=/x/nanovllm.jsonl"]),
            dict(run, run="sync", output_tokens_per_s=18000.0, overrides=["scheduler.async_scheduling=false"]),
        ]
    }
    n2 = {"peer_status": "ok", "output_tokens_per_s": 16000.0, "total_tokens": 133966, "instance_match": True}
    a = {
        "gpu": {"gpu": "NVIDIA H200, 143771 MiB"},
        "versions": {"torch": "2.11", "triton": "3.6"},
        "device_rates": {"device": "cuda", "copy_bandwidth_gb_s": 4250.0, "gemm_tflop_s": 780.0},
    }
    core, correctness = tmp_path / "core.json", tmp_path / "correctness.json"
    core.write_text(json.dumps({"stages": [{"stage": s, "metrics": m} for s, m in (("a", a), ("n1", n1), ("n2", n2))]}))
    b = {"passed": 120, "failed": 0, "skipped": 3}
    correctness.write_text(
        json.dumps({"stages": [{"stage": "b", "metrics": b}, {"stage": "c", "metrics": {"same_text": True}}]})
    )
    return [core, correctness]


def test_results_section_holds_the_floor_the_peer_and_the_ratio(tmp_path):
    stages = load_stages(_core_summaries(tmp_path))
    text = render(stages, "2026-11-28")
    assert text.startswith("## GPU session: NVIDIA H200, 143771 MiB, 2026-11-28")
    rows = [line for line in text.splitlines() if line.startswith("| minivllm") or line.startswith("| nano-vllm")]
    assert rows[0] == (
        "| minivllm `(defaults: CUDA graphs, async scheduling)` | 20000 | 55.9 | 35800 (4250, 780) | 0.90 (0.18) "
        "| 5.80 (3.56) | 820 |"
    )
    assert rows[1].startswith("| minivllm `scheduler.async_scheduling=false` | 18000 |")
    assert rows[2].startswith("| nano-vllm bench.py (?; instance match True) | 16000 |")
    assert "minivllm ÷ nano-vllm on the same GPU and instance: 1.25x (graphs), 1.12x (sync)." in text
    assert "`pytest -m gpu`: 120 passed, 0 failed (errors included), 3 skipped." in text
    assert "same text yes" in text
    assert "Idle device: copy 4250 GB/s (1 GiB, CUDA events, read + write), bf16 GEMM 780.0 TFLOP/s." in text


def test_results_update_replaces_summary_rows_of_the_same_kind_and_appends_the_section(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "# Benchmark results\n\n## Summary\n\n| what | machine, date | result | section |\n| --- | --- | --- | --- |\n"
        "| nano-vllm's exact instance, output tok/s (defaults: graphs, async) | H200, 2026-11-26 | 1 | old |\n"
        "| prefix caching | CPU | 3.3x | Prefix caching |\n\n## Older section\n\ntext\n"
    )
    from tools.gpu_session import results_md

    assert (
        results_md.main([*map(str, _core_summaries(tmp_path)), "--date", "2026-11-28", "--results", str(results)]) == 0
    )
    lines = results.read_text().splitlines()
    table = [line for line in lines if line.startswith("| ") and not line.startswith("| ---")][:4]
    assert table[1].startswith(
        "| nano-vllm's exact instance, output tok/s (defaults: graphs, async) | H200, 2026-11-28 | 20000"
    )
    assert table[2].startswith("| against nano-vllm on the same GPU and instance | H200, 2026-11-28 | 1.25x")
    assert table[3] == "| prefix caching | CPU | 3.3x | Prefix caching |"
    assert "| 1 | old |" not in results.read_text()
    assert lines.index("## Older section") < lines.index("## GPU session: NVIDIA H200, 143771 MiB, 2026-11-28")


def test_attention_benchmark_times_a_batch_of_mixed_contexts(tmp_path):
    """--mixed: one decode batch whose requests' contexts differ (as a serving batch's do), checked
    against SDPA on its first requests."""
    out = tmp_path / "attention.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "attention.py"), "--cpu-smoke", "--mixed", "3", "5", "40"]
    proc = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    mixed = [r for r in json.loads(out.read_text())["rows"] if "mixed" in r["case"]]
    assert len(mixed) == 1 and mixed[0]["num_reqs"] == 3 and 5 <= mixed[0]["context_len"] <= 40
    assert mixed[0]["max |diff|"] < 0.05 and mixed[0]["KV GB/s"] > 0
