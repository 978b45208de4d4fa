"""The session's bookkeeping for tools/gpu_session.sh.

    python3 -m tools.gpu_session.summary finish STAGE_DIR STAGE RC SECONDS [--skipped REASON]
    python3 -m tools.gpu_session.summary write WORK_DIR OUT_DIR STAGE...

``finish`` stamps a stage's metrics.json (whatever the stage wrote, or nothing)
with its status, exit code and seconds: ``ok`` (exit 0), ``timeout`` (124/137,
the stage's ``timeout`` fired), ``failed`` (any other code) or ``skipped``.
``write`` gathers every stage's metrics.json into OUT_DIR/summary.json and
prints a table of stage, status, seconds and the stage's key numbers
(also written to OUT_DIR/summary.txt).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

TIMEOUT_CODES = (124, 137)
STAGES = {
    "a": "environment",
    "b": "pytest -m gpu",
    "c": "demo: graphs vs eager",
    "d1": "nanovllm: graphs, eager (default)",
    "d2": "nanovllm: torch_compile, sync (default)",
    "d3": "transformers generate vs minivllm",
    "d4": "attention kernel bandwidth",
    "d5": "decode profile",
    "d6": "fused MoE, int4 and fp8 GEMMs",
    "d7": "multimodal: LLaVA, Qwen2-VL shapes",
    "n1": "nano-vllm instance: defaults, sync",
    "n2": "nano-vllm itself, same instance",
    "p": "decode profile: batch 256, 32",
    "m": "sampler, attention, MoE, int4/fp8",
}


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def status_of(rc: int, skipped: str | None) -> str:
    if skipped:
        return "skipped"
    if rc == 0:
        return "ok"
    return "timeout" if rc in TIMEOUT_CODES else "failed"


def finish(stage_dir: Path, stage: str, rc: int, seconds: float, skipped: str | None) -> dict[str, Any]:
    stage_dir.mkdir(parents=True, exist_ok=True)
    metrics = _read(stage_dir / "metrics.json")
    metrics.update(stage=stage, status=status_of(rc, skipped), rc=rc, seconds=round(seconds, 1))
    if skipped:
        metrics["skipped"] = skipped
    (stage_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics


def _num(value: Any, fmt: str = ".0f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _env(m: dict[str, Any]) -> str:
    gpu = m.get("gpu") or {}
    v = m.get("versions") or {}
    name = gpu.get("gpu") or gpu.get("skipped") or "no GPU"
    failed = ", ".join(m.get("failed_checks") or []) or "none"
    rates = m.get("device_rates") or {}
    return (
        f"{name}; torch {v.get('torch')}, triton {v.get('triton')}, transformers {v.get('transformers')}; "
        f"copy {_num(rates.get('copy_bandwidth_gb_s'))} GB/s, GEMM {_num(rates.get('gemm_tflop_s'), '.1f')} TFLOP/s; "
        f"failed checks: {failed}"
    )


def _pytest(m: dict[str, Any]) -> str:
    return f"{m.get('passed')} passed, {m.get('failed')} failed, {m.get('skipped')} skipped"


def _demo(m: dict[str, Any]) -> str:
    runs = m.get("runs") or ["?", "?"]
    speeds = ", ".join(f"{r} {_num(m.get(f'{r}_output_tokens_per_s'))} tok/s" for r in runs)
    return f"same text: {'yes' if m.get('same_text') else 'NO'}; {speeds}"


def _bench(m: dict[str, Any]) -> str:
    parts = []
    for r in m.get("runs") or []:
        if r.get("status") != "ok":
            parts.append(f"{r['run']}: {r.get('status')}")
            continue
        text = (
            f"{r['run']}: {_num(r['output_tokens_per_s'])} tok/s, {_num(r['roofline_percent'], '.1f')}% roofline, "
            f"{r['num_preemptions']} preempt, {r['num_kv_blocks']} blocks"
        )
        if r.get("speedup_vs_hf") is not None:
            text += f"; hf {_num(r['hf_output_tokens_per_s'])} tok/s -> {_num(r['speedup_vs_hf'], '.1f')}x"
        parts.append(text)
    return "; ".join(parts)


def _attention(m: dict[str, Any]) -> str:
    rows = m.get("rows") or []
    decode = [r for r in rows if r.get("query_len") == 1 and r.get("num_splits") is None]
    parts = [f"copy {_num(m.get('copy_bandwidth_gb_s'))} GB/s"]
    if decode:
        top = max(decode, key=lambda r: (r["num_reqs"], r["context_len"]))
        parts.append(f"{top['case']}: {_num(top['KV GB/s'])} GB/s ({_num(top['% copy bw'], '.1f')}% of copy)")
    parts += [f"{r['case']}: {_num(r['TFLOP/s'], '.1f')} TFLOP/s" for r in rows if r.get("query_len", 1) > 1]
    return "; ".join(parts)


def _profile(m: dict[str, Any]) -> str:
    groups = m.get("groups") or {}
    shares = ", ".join(f"{g} {_num(v.get('percent'), '.0f')}%" for g, v in groups.items())
    return f"step {_num(m.get('step_ms'), '.2f')} ms at batch {m.get('batch')}; {shares}"


def _kernels(m: dict[str, Any]) -> str:
    """The largest token count of each kernel benchmark: its speed against the torch path."""
    parts = []
    for r in (m.get("moe") or {}).get("rows") or []:
        if r.get("triton_ms") and r["tokens"] == max(x["tokens"] for x in m["moe"]["rows"]):
            parts.append(f"moe {r['shape']} x{r['tokens']}: {r['torch_ms'] / r['triton_ms']:.1f}x torch")
    for r in (m.get("quant_gemm") or {}).get("rows") or []:
        if r["tokens"] == 1:
            ratios = [f"{k} {r['bf16_ms'] / r[f'{k}_ms']:.1f}x" for k in ("int4", "fp8") if r.get(f"{k}_ms")]
            parts.append(f"M=1 {r['shape']}: {', '.join(ratios) or 'no quantized path'} vs bf16")
    return "; ".join(parts)


def _multimodal(m: dict[str, Any]) -> str:
    """Each image model's images/s, output tok/s and encoder share; the graphs vs eager text check."""
    parts = []
    for r in m.get("runs") or []:
        if r.get("status") != "ok":
            parts.append(f"{r['run']}: {r.get('status')}")
            continue
        parts.append(
            f"{r['run']}: {_num(r['images_per_s'], '.1f')} images/s, {_num(r['output_tokens_per_s'])} tok/s, "
            f"encoder {_num(r['encoder_percent'], '.1f')}% of step time"
        )
    check = m.get("graphs_vs_eager")
    if check:
        graphs = "graphs captured" if check.get("cuda_graphs_captured") else "no graphs captured"
        parts.append(f"tiny LLaVA graphs vs eager same text: {'yes' if check.get('same_text') else 'NO'} ({graphs})")
    return "; ".join(parts)


def _exact(m: dict[str, Any]) -> str:
    """Each run's tok/s, % of the corrected floor and its prefill/decode seconds."""
    parts = []
    for r in m.get("runs") or []:
        if r.get("status") != "ok":
            parts.append(f"{r['run']}: {r.get('status')}")
            continue
        parts.append(
            f"{r['run']}: {_num(r['output_tokens_per_s'])} tok/s = {_num(r['roofline_percent'], '.1f')}% of floor "
            f"{_num(r.get('floor_output_tokens_per_s'))} tok/s (prefill {_num(r.get('prefill_measured_s'), '.2f')} s, "
            f"decode {_num(r.get('decode_measured_s'), '.2f')} s)"
        )
    return "; ".join(parts)


def _peer(m: dict[str, Any]) -> str:
    if m.get("output_tokens_per_s") is None:
        return f"nano-vllm: {m.get('peer_status')}"
    text = f"nano-vllm {_num(m.get('output_tokens_per_s'))} tok/s ({m.get('total_tokens')} tokens"
    return text + f", instance match {m.get('instance_match')})"


def _core_profile(m: dict[str, Any]) -> str:
    parts = [_profile(m)]
    if m.get("batch32"):
        parts.append(_profile(m["batch32"]))
    return " | ".join(parts)


def _micro(m: dict[str, Any]) -> str:
    parts = [_kernels(m)]
    if m.get("attention"):
        parts.append(_attention(m["attention"]))
    return "; ".join(p for p in parts if p)


KEY_NUMBERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "a": _env,
    "b": _pytest,
    "c": _demo,
    "d1": _bench,
    "d2": _bench,
    "d3": _bench,
    "d4": _attention,
    "d5": _profile,
    "d6": _kernels,
    "d7": _multimodal,
    "n1": _exact,
    "n2": _peer,
    "p": _core_profile,
    "m": _micro,
}


_RUNNER_KEYS = {"stage", "status", "rc", "seconds", "skipped"}


def key_numbers(stage: str, m: dict[str, Any]) -> str:
    if m.get("status") == "skipped":
        return str(m.get("skipped"))
    if set(m) <= _RUNNER_KEYS:
        return f"no metrics: see {stage}/log.txt in session.tar.gz"
    try:
        return KEY_NUMBERS[stage](m) if stage in KEY_NUMBERS else ""
    except (KeyError, TypeError, ValueError) as e:
        return f"(metrics incomplete: {type(e).__name__} {e})"


def write(work: Path, out: Path, stages: list[str]) -> str:
    rows = []
    for stage in stages:
        m = _read(work / stage / "metrics.json")
        rows.append(
            {
                "stage": stage,
                "what": STAGES.get(stage, ""),
                "status": m.get("status", "not run"),
                "seconds": m.get("seconds"),
                "key_numbers": key_numbers(stage, m) if m else "",
                "metrics": m,
            }
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"stages": rows}, indent=2))
    lines = [f"{'stage':6}{'what':36}{'status':9}{'s':>7}  key numbers"]
    lines += [
        f"{r['stage']:6}{r['what']:36}{r['status']:9}{_num(r['seconds'], '.0f'):>7}  {r['key_numbers']}" for r in rows
    ]
    table = "\n".join(lines)
    (out / "summary.txt").write_text(table + "\n")
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("finish")
    f.add_argument("stage_dir", type=Path)
    f.add_argument("stage")
    f.add_argument("rc", type=int)
    f.add_argument("seconds", type=float)
    f.add_argument("--skipped", default=None, help="why the stage did not run")
    w = sub.add_parser("write")
    w.add_argument("work", type=Path)
    w.add_argument("out", type=Path)
    w.add_argument("stages", nargs="+")
    args = p.parse_args(argv)
    if args.command == "finish":
        finish(args.stage_dir, args.stage, args.rc, args.seconds, args.skipped)
    else:
        print(write(args.work, args.out, args.stages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
