"""The metrics.json of a stage of tools/gpu_session.sh, from what its runs left behind.

    python3 -m tools.gpu_session.stage_metrics pytest STAGE_DIR [--expect-passes]  # junit.xml -> counts
    python3 -m tools.gpu_session.stage_metrics demo STAGE_DIR A B    # runs A and B generated the same text?
    python3 -m tools.gpu_session.stage_metrics bench STAGE_DIR RUN...  # one row per task=bench run folder
    python3 -m tools.gpu_session.stage_metrics kernels STAGE_DIR FILE...  # kernel benchmarks' JSON rows
    python3 -m tools.gpu_session.stage_metrics multimodal STAGE_DIR RUN...  # bench=multimodal runs + text check

Each writes STAGE_DIR/metrics.json and exits 1 when the stage's own verdict is a
failure (a failed test, different texts, a bench run without metrics).
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any


def pytest_metrics(stage: Path, expect_passes: bool) -> dict[str, Any]:
    """Counts from pytest's junit.xml, the failed tests' ids and the skip reasons;
    not ok with a failure, or with no test passed where some should (on a GPU)."""
    path = stage / "junit.xml"
    if not path.is_file():
        return {"ok": False, "error": "pytest wrote no junit.xml"}
    failed, skipped, passed = [], Counter(), 0
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            failed.append({"test": test_id, "message": (bad.get("message") or "")[:300]})
        elif skip is not None:
            skipped[(skip.get("message") or "").strip()[:200]] += 1
        else:
            passed += 1
    return {
        "ok": not failed and (passed > 0 or not expect_passes),
        "passed": passed,
        "failed": len(failed),
        "skipped": sum(skipped.values()),
        "failures": failed[:30],
        "skip_reasons": dict(skipped.most_common()),
    }


def _outputs(run: Path) -> list[dict[str, Any]]:
    path = run / "outputs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def demo_metrics(stage: Path, first: str, second: str) -> dict[str, Any]:
    """Do two ``task=generate`` runs hold the same completions? Where do they part first?"""
    a, b = _outputs(stage / first), _outputs(stage / second)
    out: dict[str, Any] = {"runs": [first, second], "num_prompts": [len(a), len(b)]}
    mismatches = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x["token_ids"] != y["token_ids"]:
            at = next(
                (j for j, (s, t) in enumerate(zip(x["token_ids"], y["token_ids"])) if s != t),
                min(len(x["token_ids"]), len(y["token_ids"])),
            )
            mismatches.append(
                {"prompt": i, "first_different_token": at, first: x["text"][:200], second: y["text"][:200]}
            )
    out["same_text"] = bool(a) and len(a) == len(b) and not mismatches
    out["mismatches"] = mismatches
    for name in (first, second):
        metrics = _read(stage / name / "metrics.json")
        out[f"{name}_output_tokens_per_s"] = metrics.get("output_tokens_per_s")
    out["ok"] = out["same_text"]
    return out


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _overrides(run: Path) -> list[str]:
    """The command-line overrides Hydra recorded for a run (``.hydra/overrides.yaml``), if any."""
    path = run / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    return [line[2:].strip() for line in path.read_text().splitlines() if line.startswith("- ")]


def bench_row(run: Path) -> dict[str, Any]:
    """The numbers of one ``task=bench`` run that the results table needs."""
    m = _read(run / "metrics.json")
    if m.get("status") != "ok":
        return {
            "run": run.name,
            "status": m.get("status", "no metrics"),
            "error": m.get("error"),
            "overrides": _overrides(run),
        }
    roof, single, base = m.get("roofline") or {}, m.get("single_request") or {}, m.get("baseline") or {}
    engine = m.get("engine") or {}
    pct, decode_pct = roof.get("achieved_fraction"), roof.get("decode_achieved_fraction")
    return {
        "run": run.name,
        "status": "ok",
        "overrides": _overrides(run),
        "device": m.get("device"),
        "num_requests": m.get("num_requests"),
        "output_tokens_per_s": m.get("output_tokens_per_s"),
        "roofline_percent": None if pct is None else 100 * pct,
        "decode_roofline_percent": None if decode_pct is None else 100 * decode_pct,
        "roofline_floor_s": roof.get("floor_s"),
        "floor_output_tokens_per_s": roof.get("floor_output_tokens_per_s"),
        "decode_floor_s": roof.get("decode_floor_s"),
        "prefill_floor_s": roof.get("prefill_floor_s"),
        "prefill_compute_floor_s": roof.get("prefill_compute_floor_s"),
        "prefill_measured_s": roof.get("prefill_measured_s"),
        "decode_measured_s": roof.get("decode_measured_s"),
        "gemm_tflop_s": roof.get("gemm_tflop_s"),
        "copy_bandwidth_gb_s": roof.get("copy_bandwidth_gb_s"),
        "total_time_s": m.get("total_time_s"),
        "num_preemptions": m.get("num_preemptions"),
        "num_kv_blocks": m.get("num_kv_blocks"),
        "block_size": m.get("block_size"),
        "peak_memory_gib": m.get("peak_memory_gib"),
        "single_decode_tokens_per_s": single.get("decode_tokens_per_s"),
        "overhead_per_step_ms": engine.get("overhead_per_step_ms"),
        "num_steps": engine.get("num_steps"),
        "num_prefill_steps": engine.get("num_prefill_steps"),
        "prefill_step_time_s": engine.get("prefill_step_time_s"),
        "hf_output_tokens_per_s": base.get("output_tokens_per_s"),
        "speedup_vs_hf": m.get("speedup_output_tokens_per_s"),
    }


def bench_metrics(stage: Path, runs: list[str]) -> dict[str, Any]:
    rows = [bench_row(stage / name) for name in runs]
    return {"ok": bool(rows) and all(r["status"] == "ok" for r in rows), "runs": rows}


def image_row(run: Path) -> dict[str, Any]:
    """A ``bench=multimodal`` run: the bench row, plus images/s and the vision encoder's share."""
    row = bench_row(run)
    if row["status"] != "ok":
        return row
    m = _read(run / "metrics.json")
    engine = m.get("engine") or {}
    fraction = engine.get("encoder_fraction")
    return {
        **row,
        "architecture": m.get("architecture"),
        "dtype": m.get("dtype"),
        "images": m.get("images"),
        "images_encoded": m.get("images_encoded"),
        "images_per_s": m.get("images_per_s"),
        "input_tokens": m.get("input_tokens"),
        "encoder_time_s": engine.get("encoder_time_s"),
        "encoder_percent": None if fraction is None else 100 * fraction,
    }


def multimodal_metrics(stage: Path, runs: list[str]) -> dict[str, Any]:
    """The image bench runs, and (when its folders exist) the tiny LLaVA's CUDA graphs vs eager
    text check (``vlm_graphs``): not ok when a run has no metrics or the texts differ."""
    rows = [image_row(stage / name) for name in runs]
    out: dict[str, Any] = {"runs": rows}
    ok = all(r["status"] == "ok" for r in rows)
    checked = (stage / "vlm_graphs").is_dir() or (stage / "vlm_eager").is_dir()
    if checked:
        check = demo_metrics(stage, "vlm_graphs", "vlm_eager")
        info = _read(stage / "vlm_graphs" / "run.json")
        check = {k: v for k, v in check.items() if not k.endswith("_output_tokens_per_s")}
        check.update(device=info.get("device"), dtype=info.get("dtype"))
        check["cuda_graphs_captured"] = info.get("cuda_graphs_captured")
        out["graphs_vs_eager"] = check
        ok = ok and check["ok"]
    out["ok"] = ok and (bool(rows) or checked)
    return out


def kernel_metrics(stage: Path, files: list[str]) -> dict[str, Any]:
    """The rows of kernel benchmarks (``--json`` files of benchmarks/moe.py, quant_gemm.py),
    keyed by file stem; not ok when one is missing or has no rows."""
    out: dict[str, Any] = {}
    for name in files:
        out[Path(name).stem] = _read(stage / name)
    out["ok"] = bool(files) and all(out[Path(n).stem].get("rows") for n in files)
    return out


def peer_metrics(stage: Path) -> dict[str, Any]:
    """tools/nanovllm_peer.py's record (peer.json)."""
    m = _read(stage / "peer.json")
    status = m.pop("status", "no peer.json")
    return {**m, "peer_status": status, "ok": status == "ok" or status.startswith("skipped")}


def profile_metrics(stage: Path) -> dict[str, Any]:
    """The batch-256 profile (profile.json) with the batch-32 one (batch32.json) under ``batch32``."""
    m, small = _read(stage / "profile.json"), _read(stage / "batch32.json")
    return {**m, "batch32": small or None, "ok": bool(m) and bool(small)}


def micro_metrics(stage: Path) -> dict[str, Any]:
    """Fused MoE and quantized GEMMs (as the kernels stage) with the attention rows under ``attention``."""
    m = kernel_metrics(stage, ["moe.json", "quant_gemm.json"])
    attention = _read(stage / "attention.json")
    sampler = (stage / "sampler.txt").read_text() if (stage / "sampler.txt").is_file() else ""
    return {**m, "attention": attention or None, "sampler": sampler, "ok": m["ok"] and bool(attention)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=("pytest", "demo", "bench", "kernels", "multimodal", "peer", "profile", "micro"))
    p.add_argument("stage_dir", type=Path)
    p.add_argument(
        "runs",
        nargs="*",
        help="demo: two run folders; bench, multimodal: the run folders, in table order; kernels: JSON files",
    )
    p.add_argument("--expect-passes", action="store_true", help="pytest: no passed test is a failure")
    args = p.parse_args(argv)
    if args.kind == "pytest":
        metrics = pytest_metrics(args.stage_dir, args.expect_passes)
    elif args.kind == "demo":
        if len(args.runs) != 2:
            p.error("demo compares exactly two run folders")
        metrics = demo_metrics(args.stage_dir, *args.runs)
    elif args.kind == "kernels":
        metrics = kernel_metrics(args.stage_dir, args.runs)
    elif args.kind == "multimodal":
        metrics = multimodal_metrics(args.stage_dir, args.runs)
    elif args.kind == "peer":
        metrics = peer_metrics(args.stage_dir)
    elif args.kind == "profile":
        metrics = profile_metrics(args.stage_dir)
    elif args.kind == "micro":
        metrics = micro_metrics(args.stage_dir)
    else:
        metrics = bench_metrics(args.stage_dir, args.runs)
    (args.stage_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    print(json.dumps({k: v for k, v in metrics.items() if k not in ("failures", "skip_reasons", "mismatches")}))
    return 0 if metrics["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
