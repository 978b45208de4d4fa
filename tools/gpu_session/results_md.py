"""A benchmarks/RESULTS.md section drafted from the summary.json files of GPU session runs.

    python3 -m tools.gpu_session.results_md OUT1/summary.json [OUT2/summary.json ...] [--date 2026-11-24]
        [--results benchmarks/RESULTS.md]    # append the section and update the summary table there

The --core call's stages (n1: nano-vllm's exact instance with the defaults and with sync
scheduling, each against its corrected floor; n2: nano-vllm itself on the same GPU; p: the
decode profile at batch 256 and 32; m: sampler, attention, MoE and quantized GEMMs) come
first, then the --correctness call's (b, c) and the older stages.

Stages found in later files replace those of earlier ones, except the bench
stages (d1-d3, d7), whose runs are merged by name (a later run of the same name
wins): one session may run `graphs` in one call and `eager` in the next. The
draft holds the device, the commands and one table per measurement (nanovllm
configurations, transformers vs minivllm, attention bandwidth, decode profile,
fused MoE and quantized GEMMs, vision-language throughput); the commentary on goals is left to the reader.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

BENCH = "python3 -m minivllm task=bench bench=nanovllm model=qwen3-0.6b load.format=dummy"
BASE_OVERRIDES = {"task", "bench", "model", "load.format", "bench.progress", "hydra.run.dir"}
CONFIGS = {
    "graphs": "(defaults: CUDA graphs, async scheduling)",
    "eager": "compilation.cudagraph=false",
    "compile": "compilation.torch_compile=true",
    "sync": "scheduler.async_scheduling=false",
    "hf_vs_minivllm": "bench.baseline=hf bench.num_prompts=32 bench.max_output_len=512 bench.hf_batch_size=8",
}


MERGED = ("d1", "d2", "d3", "d7", "n1")
"""Stages whose runs merge by name across summaries (their other keys: the later file's, else the earlier's)."""
MM_BENCH = "python3 -m minivllm task=bench bench=multimodal load.format=dummy model.path=DIR"
MM_BASE = {"task", "bench", "load.format", "bench.progress", "hydra.run.dir", "model.path"}


def _f(value: Any, fmt: str = ".0f") -> str:
    return "n/a" if value is None else format(value, fmt)


def load_stages(paths: list[Path]) -> dict[str, dict[str, Any]]:
    stages: dict[str, dict[str, Any]] = {}
    for path in paths:
        for row in json.loads(path.read_text())["stages"]:
            metrics = row.get("metrics")
            if not metrics:
                continue
            if row["stage"] in MERGED and row["stage"] in stages:
                earlier = stages[row["stage"]]
                runs = {r["run"]: r for r in earlier.get("runs", [])}
                runs.update({r["run"]: r for r in metrics.get("runs", [])})
                metrics = {**earlier, **metrics, "runs": list(runs.values())}
            stages[row["stage"]] = metrics
    return stages


def _config_label(run: dict[str, Any]) -> str:
    """The overrides a run added to the bench command (as Hydra recorded them), else its known name."""
    if not run.get("overrides"):
        return CONFIGS.get(run["run"], run["run"])
    return _added(run["overrides"], BASE_OVERRIDES) or CONFIGS["graphs"]


def _added(overrides: list[str], base: set[str]) -> str:
    """The overrides whose keys are not in ``base``, each key once with its last value (as Hydra applies them)."""
    last: dict[str, str] = {}
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key not in base:
            last.pop(key, None)
            last[key] = override
    return " ".join(last.values())


def _bench_table(stages: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| configuration | output tok/s | % of roofline floor (decode steps) | prefill steps: s of total s "
        "| preemptions | KV blocks | single-request decode tok/s | vs transformers |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for stage in ("d1", "d2", "d3"):
        for r in stages.get(stage, {}).get("runs", []):
            config = f"`{_config_label(r)}`"
            if r.get("status") != "ok":
                lines.append(f"| {config} | {r.get('status')} | | | | | | |")
                continue
            versus = (
                ""
                if r.get("speedup_vs_hf") is None
                else (f"{_f(r['speedup_vs_hf'], '.1f')}x (transformers {_f(r['hf_output_tokens_per_s'])} tok/s)")
            )
            roof = f"{_f(r['roofline_percent'], '.1f')} ({_f(r.get('decode_roofline_percent'), '.1f')})"
            prefill = f"{_f(r.get('prefill_step_time_s'), '.2f')} of {_f(r.get('total_time_s'), '.2f')}"
            lines.append(
                f"| {config} | {_f(r['output_tokens_per_s'])} | {roof} | {prefill} | "
                f"{r['num_preemptions']} | {r['num_kv_blocks']} | "
                f"{_f(r['single_decode_tokens_per_s'])} | {versus} |"
            )
    return lines


def _attention_table(m: dict[str, Any]) -> list[str]:
    lines = [
        f"Copy bandwidth {_f(m.get('copy_bandwidth_gb_s'))} GB/s; {m.get('dtype')}, "
        f"{m.get('num_heads')}/{m.get('num_kv_heads')} heads, head_dim {m.get('head_dim')}, "
        f"block_size {m.get('block_size')}.",
        "",
        "| case | ms | KV GB/s | % of copy | TFLOP/s |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['case']} | {_f(r['triton ms'], '.3f')} | {_f(r['KV GB/s'])} | {_f(r['% copy bw'], '.1f')} | "
        f"{_f(r['TFLOP/s'], '.1f')} |"
        for r in m.get("rows", [])
    ]
    return lines


def _profile_table(m: dict[str, Any], top: int = 10) -> list[str]:
    lines = [
        f"Batch {m.get('batch')} x {m.get('context')} context, CUDA graphs {m.get('cudagraph')}: step "
        f"{_f(m.get('step_ms'), '.2f')} ms unprofiled ({_f(m.get('decode_tokens_per_s'))} tok/s), kernels "
        f"{_f(m.get('kernel_ms_per_step'), '.2f')} ms/step.",
        "",
        "| group | ms/step | % |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| {g} | {_f(v['ms_per_step'], '.3f')} | {_f(v['percent'], '.1f')} |" for g, v in m.get("groups", {}).items()
    ]
    lines += ["", "| kernel | group | ms/step | % |", "| --- | --- | --- | --- |"]
    lines += [
        f"| `{k['name'][:90]}` | {k['group']} | {_f(k['ms_per_step'], '.3f')} | {_f(k['percent'], '.1f')} |"
        for k in m.get("top", [])[:top]
    ]
    return lines


def _kernel_tables(m: dict[str, Any]) -> list[str]:
    out: list[str] = []
    moe = m.get("moe") or {}
    if moe.get("rows"):
        out += [
            f"Fused MoE (`benchmarks/moe.py`), {moe.get('dtype')}: the Triton kernel against the torch loop "
            "over experts.",
            "",
            "| layer | tokens | torch ms | triton ms | speedup | weight GB/s | max err | tiles |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        out += [
            f"| {r['shape']} | {r['tokens']} | {_f(r['torch_ms'], '.3f')} | {_f(r.get('triton_ms'), '.3f')} | "
            f"{_f(r['torch_ms'] / r['triton_ms'] if r.get('triton_ms') else None, '.2f')}x | "
            f"{_f(r['weight_gbs'])} | {_f(r.get('max_err'), '.1e')} | {r.get('tiles', '-')} |"
            for r in moe["rows"]
        ]
    quant = m.get("quant_gemm") or {}
    if quant.get("rows"):
        out += [
            "",
            f"Quantized GEMMs (`benchmarks/quant_gemm.py`), int4 group {quant.get('group')}: time against "
            "bf16 `F.linear` (a ratio above 1 is faster than bf16).",
            "",
            "| weight | M | bf16 ms | int4 ms (vs bf16) | int4 act-order ms (vs bf16) | int4 torch ref ms "
            "| fp8 ms (vs bf16) | fp8 _scaled_mm ms (vs bf16) | fp8 Triton ms (vs bf16) | err int4 / fp8 | int4 tiles |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in quant["rows"]:
            out.append(
                f"| {r['shape']} | {r['tokens']} | {_f(r['bf16_ms'], '.4f')} | {_against_bf16(r, 'int4_ms')} | "
                f"{_against_bf16(r, 'int4_act_order_ms')} | {_f(r['int4_torch_ms'], '.4f')} | {_against_bf16(r, 'fp8_ms')} | "
                f"{_against_bf16(r, 'fp8_scaled_mm_ms')} | {_against_bf16(r, 'fp8_triton_ms')} | "
                f"{_f(r.get('int4_err'), '.1e')} / {_f(r.get('fp8_err'), '.1e')} | {r.get('int4_tiles', '-')} |"
            )
    return out + _fp8_quant_table(quant)


def _fp8_quant_table(quant: dict[str, Any]) -> list[str]:
    """quant_gemm.py's second table: fp8 activation quantization, torch ops against the Triton kernel."""
    rows = quant.get("fp8_quant_rows")
    if not rows:
        return []
    out = [
        "",
        "fp8 activation quantization (`benchmarks/quant_gemm.py`): the torch ops against the fused Triton "
        "kernel (speed-up: torch / fused), alone and inside the fp8 linear.",
        "",
        "| weight | M | dynamic torch / fused ms (speed-up) | static torch / fused ms (speed-up) "
        "| fp8 linear torch quant / fused quant ms | same bits |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        cells = [
            f"{_f(r[f'{m}_torch_ms'], '.4f')} / {_f(r[f'{m}_fused_ms'], '.4f')} "
            f"({_f(r[f'{m}_torch_ms'] / r[f'{m}_fused_ms'], '.2f')}x)"
            for m in ("dynamic", "static")
        ]
        linear = f"{_f(r.get('linear_torch_quant_ms'), '.4f')} / {_f(r.get('linear_fused_quant_ms'), '.4f')}"
        out.append(f"| {r['shape']} | {r['tokens']} | {cells[0]} | {cells[1]} | {linear} | {r['same_bits']} |")
    return out


def _multimodal_table(m: dict[str, Any]) -> list[str]:
    """d7: one row per image model shape; the tiny LLaVA's graphs vs eager check below."""
    lines = [
        f"Vision-language throughput: `{MM_BENCH}` on `python3 -m tools.vlm_shapes SHAPE DIR` (the shape's config, "
        "no weights), images at the model's native size, plus the overrides shown.",
        "",
        "| shape | overrides | dtype | images/s | output tok/s | input tok/s (images expanded) "
        "| vision encoder % of step time | overhead ms/step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in m.get("runs", []):
        label = _added(r.get("overrides", []), MM_BASE)
        if r.get("status") != "ok":
            lines.append(f"| {r['run']} | `{label}` | {r.get('status')} | | | | | |")
            continue
        input_rate = r["input_tokens"] / r["total_time_s"] if r.get("input_tokens") and r.get("total_time_s") else None
        lines.append(
            f"| {r['run']} | `{label}` | {r.get('dtype')} | {_f(r['images_per_s'], '.1f')} | "
            f"{_f(r['output_tokens_per_s'])} | {_f(input_rate)} | {_f(r.get('encoder_percent'), '.1f')} | "
            f"{_f(r.get('overhead_per_step_ms'), '.2f')} |"
        )
    check = m.get("graphs_vs_eager")
    if check:
        same = "the same" if check.get("same_text") else f"NOT the same ({len(check.get('mismatches') or [])} differ)"
        captured = "captured" if check.get("cuda_graphs_captured") else "not captured"
        lines += [
            "",
            f"Tiny LLaVA (tools/tiny_vlm.py), {check.get('dtype')}, 4 prompts with an image, 32 greedy tokens: "
            f"CUDA graphs ({captured}) and eager give {same} tokens.",
        ]
    return lines


def _against_bf16(row: dict[str, Any], key: str) -> str:
    """A quantized time and its ratio to bf16's (above 1: faster than bf16)."""
    ratio = row["bf16_ms"] / row[key] if row.get(key) else None
    return f"{_f(row.get(key), '.4f')} ({_f(ratio, '.2f')}x)"


EXACT = (
    "python3 -m minivllm task=bench bench=nanovllm model=qwen3-0.6b load.format=dummy bench.workload=jsonl "
    "bench.prompts_file=nanovllm.jsonl"
)
"""n1's command: nano-vllm's exact instance (python3 -m minivllm.bench.workloads nanovllm nanovllm.jsonl)."""
EXACT_BASE = BASE_OVERRIDES | {"bench.workload", "bench.prompts_file"}


def ratio_to_peer(stages: dict[str, dict[str, Any]], run: str = "graphs") -> float | None:
    """minivllm's output tok/s on the instance (``run`` of n1) over nano-vllm's (n2), same GPU, same call."""
    ours = next((r for r in stages.get("n1", {}).get("runs", []) if r["run"] == run and r.get("status") == "ok"), None)
    peer = stages.get("n2", {})
    if ours is None or not peer.get("output_tokens_per_s"):
        return None
    return ours["output_tokens_per_s"] / peer["output_tokens_per_s"]


def _core_table(stages: dict[str, dict[str, Any]]) -> list[str]:
    """n1's runs against the corrected floor, nano-vllm's run (n2) and the ratio."""
    lines = [
        f"nano-vllm's exact request instance (its bench.py: 256 requests, `random.seed(0)`): `{EXACT}` plus the "
        "overrides shown; nano-vllm itself by `python3 -m tools.nanovllm_peer` (its bench.py, unmodified, flash-attn "
        "served by minivllm's paged-attention kernel) on the same GPU in the same call.",
        "",
        "| engine, configuration | output tok/s | % of the corrected floor | floor tok/s (copy GB/s, GEMM TFLOP/s) "
        "| prefill s (floor s) | decode s (floor s) | single-request decode tok/s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in stages.get("n1", {}).get("runs", []):
        label = f"minivllm `{_added(r.get('overrides', []), EXACT_BASE) or CONFIGS['graphs']}`"
        if r.get("status") != "ok":
            lines.append(f"| {label} | {r.get('status')} | | | | | |")
            continue
        floor = (
            f"{_f(r.get('floor_output_tokens_per_s'))} ({_f(r.get('copy_bandwidth_gb_s'))}, "
            f"{_f(r.get('gemm_tflop_s'))})"
        )
        decode_floor = (
            None
            if r.get("roofline_floor_s") is None or r.get("prefill_floor_s") is None
            else r["roofline_floor_s"] - r["prefill_floor_s"]
        )
        lines.append(
            f"| {label} | {_f(r['output_tokens_per_s'])} | {_f(r['roofline_percent'], '.1f')} | {floor} | "
            f"{_f(r.get('prefill_measured_s'), '.2f')} ({_f(r.get('prefill_floor_s'), '.2f')}) | "
            f"{_f(r.get('decode_measured_s'), '.2f')} ({_f(decode_floor, '.2f')}) | "
            f"{_f(r.get('single_decode_tokens_per_s'))} |"
        )
    peer = stages.get("n2")
    if peer:
        rate = _f(peer.get("output_tokens_per_s")) if peer.get("output_tokens_per_s") else peer.get("peer_status")
        lines.append(
            f"| nano-vllm bench.py ({str(peer.get('commit') or '?')[:7]}; instance match "
            f"{peer.get('instance_match')}) | {rate} | | | | | |"
        )
    ratios = [(run, ratio_to_peer(stages, run)) for run in ("graphs", "sync")]
    known = [f"{_f(x, '.2f')}x ({run})" for run, x in ratios if x is not None]
    if known:
        lines += ["", f"minivllm ÷ nano-vllm on the same GPU and instance: {', '.join(known)}."]
    return lines


def summary_rows(stages: dict[str, dict[str, Any]], machine: str, date: str) -> list[str]:
    """Rows of RESULTS.md's summary table from the core call (n1, n2)."""
    rows = []
    runs = {r["run"]: r for r in stages.get("n1", {}).get("runs", []) if r.get("status") == "ok"}
    if "graphs" in runs:
        r = runs["graphs"]
        text = (
            f"{_f(r['output_tokens_per_s'])} ({_f(r['roofline_percent'], '.1f')}% of the corrected floor, "
            f"{_f(r.get('floor_output_tokens_per_s'))} tok/s)"
        )
        if "sync" in runs:
            text += f"; {_f(runs['sync']['output_tokens_per_s'])} with sync scheduling"
        rows.append(
            f"| nano-vllm's exact instance, output tok/s (defaults: graphs, async) | {machine}, {date} | {text} "
            "| GPU session |"
        )
    ratio = ratio_to_peer(stages)
    if ratio is not None:
        peer = stages["n2"]["output_tokens_per_s"]
        rows.append(
            f"| against nano-vllm on the same GPU and instance | {machine}, {date} | {ratio:.2f}x "
            f"({_f(runs['graphs']['output_tokens_per_s'])} against {_f(peer)} tok/s) | GPU session |"
        )
    return rows


def update_results(path: Path, section: str, rows: list[str]) -> str:
    """RESULTS.md with ``section`` appended and the summary table's rows of the same kind replaced
    (a row whose first cell matches a new row's), new kinds added at the table's top."""
    text = path.read_text()
    lines = text.splitlines()
    kinds = {row.split("|")[1].strip(): row for row in rows}
    header = next((i for i, line in enumerate(lines) if line.startswith("| what |")), None)
    if header is not None:
        body = header + 2  # past the separator
        end = body
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        kept = [line for line in lines[body:end] if line.split("|")[1].strip() not in kinds]
        lines[body:end] = rows + kept
    return "\n".join(lines).rstrip("\n") + "\n\n" + section


def render(stages: dict[str, dict[str, Any]], date: str) -> str:
    gpu = (stages.get("a", {}).get("gpu") or {}).get("gpu") or stages.get("d5", {}).get("device")
    versions = stages.get("a", {}).get("versions") or {}
    out = [
        f"## GPU session: {gpu or 'GPU (name not recorded)'}, {date}",
        "",
        f"`bash tools/gpu_session.sh` (docs/gpu.md); torch {versions.get('torch')}, "
        f"triton {versions.get('triton')}, transformers {versions.get('transformers')}. "
        + _rates(stages.get("a", {})).rstrip(),
        "",
    ]
    if "n1" in stages or "n2" in stages:
        out += _core_table(stages) + [""]
    if "p" in stages:
        out += ["Decode profile (`benchmarks/profile_decode.py`, graphs and compile on):", ""]
        out += _profile_table(stages["p"])
        if stages["p"].get("batch32"):
            out += [""] + _profile_table(stages["p"]["batch32"])
        out += [""]
    if "m" in stages:
        if stages["m"].get("attention"):
            out += ["Paged attention at the workload's context lengths (`benchmarks/attention.py`):", ""]
            out += _attention_table(stages["m"]["attention"]) + [""]
        out += _kernel_tables(stages["m"])
        if stages["m"].get("sampler"):
            out += ["", "Sampler (`benchmarks/sampler.py`):", "", "```", stages["m"]["sampler"].rstrip(), "```"]
        out += [""]
    if any(k in stages for k in ("b", "c")):
        out += _correctness(stages) + [""]
    if any(k in stages for k in ("d1", "d2", "d3")):
        out += [f"Throughput: `{BENCH}` plus the overrides in the first column.", ""] + _bench_table(stages)
    if "d4" in stages:
        out += ["", "Paged attention (`benchmarks/attention.py`):", ""] + _attention_table(stages["d4"])
    if "d5" in stages:
        out += ["", "Decode profile (`benchmarks/profile_decode.py`):", ""] + _profile_table(stages["d5"])
    if "d6" in stages:
        out += [""] + _kernel_tables(stages["d6"])
    if "d7" in stages:
        out += [""] + _multimodal_table(stages["d7"])
    return "\n".join(out) + "\n"


def _rates(env: dict[str, Any]) -> str:
    rates = env.get("device_rates") or {}
    if rates.get("copy_bandwidth_gb_s") is None:
        return ""
    how, dtype = ("1 GiB, CUDA events", "bf16") if rates.get("device") != "cpu" else ("CPU, wall clock", "fp32")
    return (
        f"Idle device: copy {_f(rates['copy_bandwidth_gb_s'])} GB/s ({how}, read + write), {dtype} GEMM "
        f"{_f(rates.get('gemm_tflop_s'), '.1f')} TFLOP/s. "
    )


def _correctness(stages: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    b = stages.get("b")
    if b:
        out.append(
            f"`pytest -m gpu`: {b.get('passed')} passed, {b.get('failed')} failed (errors included), "
            f"{b.get('skipped')} skipped."
        )
    c = stages.get("c")
    if c:
        out.append(f"Demo model, CUDA graphs against eager: same text {'yes' if c.get('same_text') else 'NO'}.")
    return out


def _machine(stages: dict[str, dict[str, Any]]) -> str:
    gpu = (stages.get("a", {}).get("gpu") or {}).get("gpu") or "GPU"
    return str(gpu).replace("NVIDIA ", "").split(",")[0].strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("summaries", nargs="+", type=Path)
    p.add_argument("--date", default=datetime.date.today().isoformat())
    p.add_argument("--results", type=Path, help="append the section to this RESULTS.md and update its summary table")
    args = p.parse_args(argv)
    stages = load_stages(args.summaries)
    section = render(stages, args.date)
    if args.results:
        rows = summary_rows(stages, _machine(stages), args.date)
        args.results.write_text(update_results(args.results, section, rows))
        print(f"{args.results}: section appended, {len(rows)} summary rows updated")
    else:
        print(section, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
