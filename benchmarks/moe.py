"""Time one MoE layer's experts: the Triton fused-MoE kernel against the torch path.

    PYTHONPATH=. python benchmarks/moe.py                       # CUDA: Qwen3-30B-A3B and Mixtral-8x7B layers
    PYTHONPATH=. python benchmarks/moe.py --cpu-smoke           # tiny shapes, torch path only, on the CPU
    PYTHONPATH=. python benchmarks/moe.py --tune --tune-only     # CUDA: time tile configs, write the table
    PYTHONPATH=. python benchmarks/moe.py --gpt-oss             # CUDA: gpt-oss-20b's biased, clamped experts

Both paths get the same hidden states and the same routing (softmax top-k of
random router logits), so the table times the expert computation alone:
sorting by expert, two grouped GEMMs with SiLU-and-mul between, the weighted
combine (Triton) against a loop over the experts that received tokens (torch).
GFLOP/s counts the useful work, 6 * tokens * top_k * hidden * intermediate
(gate+up and down). Weight GB/s counts the bytes of the experts that received
at least one token, read once: decode steps are bound by it. The ``tiles`` column
is the config the kernel's wrapper chose (``tuned`` where the tuned table gave it).

``--tune`` first times ``tune_candidates`` (minivllm/layers/fused_moe/tiles.py) at
``--tune-tokens`` for each shape and merges the winners into the tuned table
(``minivllm/tuned_tiles/tables/fused_moe.json``, under this GPU's name), then runs the
benchmark, which now reads the table (``--tune-only``: no benchmark).

``--gpt-oss`` times gpt-oss-20b's experts instead: per-expert biases in both GEMMs and
the clamped SwiGLU (``triton_fused_experts(..., b13=, b2=, swiglu=)``) against gpt-oss's
torch loop (``GptOssExperts.torch_experts``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from minivllm.bench.timing import kernel_timer
from minivllm.layers.fused_moe import route, torch_fused_experts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, when run as a script
from tools.gemm_tune import add_tune_arguments, check_tune_arguments  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Shape:
    name: str
    experts: int
    top_k: int
    hidden: int
    intermediate: int


SHAPES = [Shape("qwen3-30b-a3b", 128, 8, 2048, 768), Shape("mixtral-8x7b", 8, 2, 4096, 14336)]
TINY = [Shape("tiny-8x-top2", 8, 2, 64, 32), Shape("tiny-64x-top8", 64, 8, 64, 32)]
GPT_OSS = Shape("gpt-oss-20b", 32, 4, 2880, 2880)
GPT_OSS_TINY = Shape("tiny-gpt-oss-8x-top2", 8, 2, 64, 32)
TOKENS = [1, 8, 64, 256, 1024, 4096]
TUNE_TOKENS = [1, 64, 256, 1024, 4096]  # the table's M buckets; 8 takes the nearest, 1


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--tp", type=int, default=1, help="time one rank's slice: each expert's intermediate / tp")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU, torch path only")
    p.add_argument("--gpt-oss", action="store_true", help="gpt-oss-20b's biased experts with the clamped SwiGLU")
    p.add_argument("--json", metavar="PATH", help="also write the rows here")
    add_tune_arguments(p, "the tiles", TUNE_TOKENS, 45.0)
    args = p.parse_args()
    check_tune_arguments(p, args)
    if args.cpu_smoke:
        args.tokens, args.dtype = [1, 16, 128], "fp32"
    return args


def make_inputs(shape: Shape, tokens: int, args, device: torch.device) -> tuple[torch.Tensor, ...]:
    """hidden (T, H), w13 (E, 2I, H), w2 (E, H, I), routing weights and ids (T, k), seeded."""
    dtype, I = DTYPES[args.dtype], shape.intermediate // args.tp
    gen = torch.Generator(device=device).manual_seed(0)
    w13 = torch.randn(shape.experts, 2 * I, shape.hidden, device=device, dtype=dtype, generator=gen) * 0.02
    w2 = torch.randn(shape.experts, shape.hidden, I, device=device, dtype=dtype, generator=gen) * 0.02
    hidden = torch.randn(tokens, shape.hidden, device=device, dtype=dtype, generator=gen)
    weights, ids = route(torch.randn(tokens, shape.experts, device=device, generator=gen), shape.top_k, True)
    return hidden, w13, w2, weights, ids


def gpt_oss_experts(shape: Shape, w13: torch.Tensor, w2: torch.Tensor):
    """gpt-oss's experts module (its torch loop) holding ``w13``/``w2`` and seeded biases."""
    from transformers import GptOssConfig

    from minivllm.models.gpt_oss import GptOssExperts

    config = GptOssConfig(
        hidden_size=shape.hidden,
        intermediate_size=w2.shape[-1],
        num_local_experts=shape.experts,
        num_experts_per_tok=shape.top_k,
    )
    experts = GptOssExperts(config).to(w13.device)
    gen = torch.Generator(device=w13.device).manual_seed(1)
    experts.w13.data, experts.w2.data = w13, w2
    experts.b13.data = torch.randn(experts.b13.shape, device=w13.device, generator=gen).to(w13.dtype) * 0.1
    experts.b2.data = torch.randn(experts.b2.shape, device=w13.device, generator=gen).to(w13.dtype) * 0.1
    return experts


def run_shape(shape: Shape, tokens: int, args, device: torch.device, timer) -> dict:
    I = shape.intermediate // args.tp
    hidden, w13, w2, weights, ids = make_inputs(shape, tokens, args, device)
    row = {"shape": shape.name, "tokens": tokens}
    kw, torch_experts = {}, torch_fused_experts
    if args.gpt_oss:
        experts = gpt_oss_experts(shape, w13, w2)
        kw = dict(b13=experts.b13, b2=experts.b2, swiglu=(experts.alpha, experts.limit))

        def torch_experts(hidden, w13, w2, weights, ids):
            return experts.torch_experts(hidden, weights, ids)

    row["torch_ms"] = timer(lambda: torch_experts(hidden, w13, w2, weights, ids)) * 1e3
    if device.type == "cuda":
        from minivllm.layers.fused_moe import tiles as moe_tiles
        from minivllm.layers.fused_moe.triton_experts import triton_fused_experts
        from minivllm.tuned_tiles import device_facts, lookup

        facts = device_facts(device)
        key = moe_tiles.shape_key(shape.experts, 2 * I, shape.hidden, shape.top_k, hidden.dtype)
        chosen = moe_tiles.choose_tiles(tokens, shape.experts, 2 * I, shape.hidden, shape.top_k, hidden.dtype, facts)
        tuned = lookup(moe_tiles.KERNEL, facts.name, key, tokens) is not None
        row["tiles"] = chosen.name + (" tuned" if tuned else "")
        expected = torch_experts(hidden, w13, w2, weights, ids).float()
        actual = triton_fused_experts(hidden, w13, w2, weights, ids, **kw).float()
        row["max_err"] = (actual - expected).abs().max().item()
        row["triton_ms"] = timer(lambda: triton_fused_experts(hidden, w13, w2, weights, ids, **kw)) * 1e3
        heuristic = moe_tiles.heuristic_tiles(
            tokens, shape.experts, shape.top_k, facts.arch, shape.hidden, I, facts.num_sms
        )
        if heuristic != chosen:  # the tuned table's config against the heuristic's: before and after tuning
            run = lambda: triton_fused_experts(hidden, w13, w2, weights, ids, tiles=heuristic, **kw)  # noqa: E731
            row["heuristic_ms"] = timer(run) * 1e3
    best_s = min(row.get("triton_ms", float("inf")), row["torch_ms"]) * 1e-3
    row["gflops"] = 6 * tokens * shape.top_k * shape.hidden * I / best_s / 1e9
    active = ids.unique().numel()
    row["weight_gbs"] = active * 3 * I * shape.hidden * w13.element_size() / best_s / 1e9
    return row


def format_row(r: dict) -> str:
    tri = r.get("triton_ms")
    triton_ms = f"{tri:.3f}" if tri else "-"
    speedup = f"{r['torch_ms'] / tri:.2f}x" if tri else "-"
    err = f"{r['max_err']:.1e}" if tri else "-"
    heuristic = f" (heuristic's tiles: {r['heuristic_ms']:.3f} ms)" if "heuristic_ms" in r else ""
    return (
        f"{r['shape']:>14} {r['tokens']:>6} {r['torch_ms']:>9.3f} {triton_ms:>9} {speedup:>7} "
        f"{r['gflops']:>8.1f} {r['weight_gbs']:>8.2f} {err:>8}  {r.get('tiles', '-')}{heuristic}"
    )


def goal_line(rows: list[dict]) -> str:
    """The goal: the fused kernel at least as fast as the torch loop at every token count."""
    timed = [r for r in rows if r.get("triton_ms")]
    if not timed:
        return "goal fused MoE >= the torch loop at every token count: not measured here (no CUDA)"
    worst = min(timed, key=lambda r: r["torch_ms"] / r["triton_ms"])
    ratio = worst["torch_ms"] / worst["triton_ms"]
    verdict = "met" if ratio >= 1.0 else "NOT met"
    return (
        f"goal fused MoE >= the torch loop at every token count: smallest {ratio:.2f}x "
        f"({worst['shape']}, {worst['tokens']} tokens) over {len(timed)} rows: {verdict}"
    )


def tune(args, device: torch.device) -> None:
    """Time each shape's candidates at the tune token counts; merge the winners into the table."""
    from minivllm.layers.fused_moe import tiles as moe_tiles
    from minivllm.layers.fused_moe.triton_experts import triton_fused_experts
    from minivllm.tuned_tiles import device_facts, merge_entries, table_path
    from tools.gemm_tune import Budget, compile_failures, report_line, time_candidates
    from tools.kernel_variants import moe_launch_variants

    facts, dtype = device_facts(device), DTYPES[args.dtype]
    table = args.table or table_path(moe_tiles.KERNEL)
    shapes = [dataclasses.replace(s, intermediate=s.intermediate // args.tp) for s in SHAPES]
    plan = {
        (shape.name, t, c): moe_launch_variants(shape, t, c, dtype)
        for shape in shapes
        for t in args.tune_tokens
        for c in moe_tiles.tune_candidates(
            t, shape.experts, shape.top_k, facts.arch, shape.hidden, shape.intermediate, facts.num_sms
        )
    }
    failures = compile_failures(plan, facts.arch)
    for shape in shapes:
        winners, budget = {}, Budget(args.tune_budget_s / len(shapes))  # an equal share for each shape
        for tokens in args.tune_tokens:
            if budget.spent():
                print(f"tune {shape.name} M={tokens}: budget spent, the heuristic stays")
                winners[tokens] = None  # a null bucket: nearer Ms take the heuristic, not a farther bucket
                continue
            hidden, w13, w2, weights, ids = make_inputs(shape, tokens, args, device)
            candidates = moe_tiles.tune_candidates(
                tokens, shape.experts, shape.top_k, facts.arch, shape.hidden, shape.intermediate, facts.num_sms
            )
            result = time_candidates(
                shape.name,
                tokens,
                candidates,
                lambda c, inputs=(hidden, w13, w2, weights, ids): triton_fused_experts(*inputs, tiles=c),
                torch_fused_experts(hidden, w13, w2, weights, ids),
                {c: why for (name, t, c), why in failures.items() if (name, t) == (shape.name, tokens)},
            )
            print(report_line(result, candidates[0].name), flush=True)
            winners[tokens] = None if result.best is None else result.best.as_dict()
        if winners:
            key = moe_tiles.shape_key(shape.experts, 2 * shape.intermediate, shape.hidden, shape.top_k, dtype)
            merge_entries(table, moe_tiles.KERNEL, facts.name, key, winners)
            tuned = sum(cfg is not None for cfg in winners.values())
            print(f"tune: {tuned} of {len(winners)} buckets of {key} on {facts.name} written to {table}")


def main() -> None:
    args = parse_args()
    device = torch.device("cpu" if args.cpu_smoke or not torch.cuda.is_available() else "cuda")
    if args.tune:
        tune(args, device)
        if args.tune_only:
            return
    timer = kernel_timer(device, runs=5)
    shapes = TINY if args.cpu_smoke else SHAPES
    if args.gpt_oss:
        shapes = [GPT_OSS_TINY if args.cpu_smoke else GPT_OSS]
    print(f"device={device} dtype={args.dtype} tp={args.tp} (best path counted in GFLOP/s and GB/s)")
    print(
        f"{'shape':>14} {'tokens':>6} {'torch ms':>9} {'triton ms':>9} {'speedup':>7} {'GFLOP/s':>8} "
        f"{'wt GB/s':>8} {'max err':>8}"
    )
    rows = []
    for shape in shapes:
        for tokens in args.tokens:
            rows.append(run_shape(shape, tokens, args, device, timer))
            print(format_row(rows[-1]), flush=True)
    print(goal_line(rows))
    if args.json:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        with open(args.json, "w") as f:
            json.dump({"device": name, "dtype": args.dtype, "tp": args.tp, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
