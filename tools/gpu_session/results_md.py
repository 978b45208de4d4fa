"""A benchmarks/RESULTS.md section drafted from the summary.json files of GPU session runs.

    python3 -m tools.gpu_session.results_md OUT1/summary.json [OUT2/summary.json ...] [--date 2026-11-24]

Stages found in later files replace those of earlier ones. The draft holds the
device, the commands and one table per measurement (nanovllm configurations,
transformers vs minivllm, attention bandwidth, decode profile); the commentary
on goals is left to the reader of the numbers.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

BENCH = "python3 -m minivllm task=bench bench=nanovllm model=qwen3-0.6b load.format=dummy"
CONFIGS = {
    "graphs": "(defaults: CUDA graphs, async scheduling)", "eager": "compilation.cudagraph=false",
    "compile": "compilation.torch_compile=true", "sync": "scheduler.async_scheduling=false",
    "hf_vs_minivllm": "bench.baseline=hf bench.num_prompts=32 bench.max_output_len=512 bench.hf_batch_size=8",
}


def _f(value: Any, fmt: str = ".0f") -> str:
    return "n/a" if value is None else format(value, fmt)


def load_stages(paths: list[Path]) -> dict[str, dict[str, Any]]:
    stages: dict[str, dict[str, Any]] = {}
    for path in paths:
        for row in json.loads(path.read_text())["stages"]:
            if row.get("metrics"):
                stages[row["stage"]] = row["metrics"]
    return stages


def _bench_table(stages: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| configuration | output tok/s | % of roofline floor (decode steps) | preemptions | KV blocks "
             "| single-request decode tok/s | vs transformers |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for stage in ("d1", "d2", "d3"):
        for r in stages.get(stage, {}).get("runs", []):
            config = f"`{CONFIGS.get(r['run'], r['run'])}`"
            if r.get("status") != "ok":
                lines.append(f"| {config} | {r.get('status')} | | | | | |")
                continue
            versus = "" if r.get("speedup_vs_hf") is None else (
                f"{_f(r['speedup_vs_hf'], '.1f')}x (transformers {_f(r['hf_output_tokens_per_s'])} tok/s)")
            roof = f"{_f(r['roofline_percent'], '.1f')} ({_f(r.get('decode_roofline_percent'), '.1f')})"
            lines.append(f"| {config} | {_f(r['output_tokens_per_s'])} | {roof} | "
                         f"{r['num_preemptions']} | {r['num_kv_blocks']} | "
                         f"{_f(r['single_decode_tokens_per_s'])} | {versus} |")
    return lines


def _attention_table(m: dict[str, Any]) -> list[str]:
    lines = [f"Copy bandwidth {_f(m.get('copy_bandwidth_gb_s'))} GB/s; {m.get('dtype')}, "
             f"{m.get('num_heads')}/{m.get('num_kv_heads')} heads, head_dim {m.get('head_dim')}, "
             f"block_size {m.get('block_size')}.",
             "", "| case | ms | KV GB/s | % of copy | TFLOP/s |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['case']} | {_f(r['triton ms'], '.3f')} | {_f(r['KV GB/s'])} | {_f(r['% copy bw'], '.1f')} | "
              f"{_f(r['TFLOP/s'], '.1f')} |" for r in m.get("rows", [])]
    return lines


def _profile_table(m: dict[str, Any], top: int = 10) -> list[str]:
    lines = [f"Batch {m.get('batch')} x {m.get('context')} context, CUDA graphs {m.get('cudagraph')}: step "
             f"{_f(m.get('step_ms'), '.2f')} ms unprofiled ({_f(m.get('decode_tokens_per_s'))} tok/s), kernels "
             f"{_f(m.get('kernel_ms_per_step'), '.2f')} ms/step.", "",
             "| group | ms/step | % |", "| --- | --- | --- |"]
    lines += [f"| {g} | {_f(v['ms_per_step'], '.3f')} | {_f(v['percent'], '.1f')} |"
              for g, v in m.get("groups", {}).items()]
    lines += ["", "| kernel | group | ms/step | % |", "| --- | --- | --- | --- |"]
    lines += [f"| `{k['name'][:90]}` | {k['group']} | {_f(k['ms_per_step'], '.3f')} | {_f(k['percent'], '.1f')} |"
              for k in m.get("top", [])[:top]]
    return lines


def render(stages: dict[str, dict[str, Any]], date: str) -> str:
    gpu = (stages.get("a", {}).get("gpu") or {}).get("gpu") or stages.get("d5", {}).get("device")
    versions = stages.get("a", {}).get("versions") or {}
    out = [f"## GPU session: {gpu or 'GPU (name not recorded)'}, {date}", "",
           f"`bash tools/gpu_session.sh` (docs/gpu.md); torch {versions.get('torch')}, "
           f"triton {versions.get('triton')}, transformers {versions.get('transformers')}. "
           f"Throughput: `{BENCH}` plus the overrides in the first column.", ""]
    out += _bench_table(stages)
    if "d4" in stages:
        out += ["", "Paged attention (`benchmarks/attention.py`):", ""] + _attention_table(stages["d4"])
    if "d5" in stages:
        out += ["", "Decode profile (`benchmarks/profile_decode.py`):", ""] + _profile_table(stages["d5"])
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("summaries", nargs="+", type=Path)
    p.add_argument("--date", default=datetime.date.today().isoformat())
    args = p.parse_args(argv)
    print(render(load_stages(args.summaries), args.date), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
