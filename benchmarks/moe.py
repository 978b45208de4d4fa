"""Time one MoE layer's experts: the Triton fused-MoE kernel against the torch path.

    PYTHONPATH=. python benchmarks/moe.py                       # CUDA: Qwen3-30B-A3B and Mixtral-8x7B layers
    PYTHONPATH=. python benchmarks/moe.py --cpu-smoke           # tiny shapes, torch path only, on the CPU

Both paths get the same hidden states and the same routing (softmax top-k of
random router logits), so the table times the expert computation alone:
sorting by expert, two grouped GEMMs with SiLU-and-mul between, the weighted
combine (Triton) against a loop over the experts that received tokens (torch).
GFLOP/s counts the useful work, 6 * tokens * top_k * hidden * intermediate
(gate+up and down). Weight GB/s counts the bytes of the experts that received
at least one token, read once: decode steps are bound by it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import torch

from minivllm.bench.timing import kernel_timer
from minivllm.layers.fused_moe import route, torch_fused_experts

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


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256, 1024, 4096])
    p.add_argument("--dtype", choices=DTYPES, default="bf16")
    p.add_argument("--tp", type=int, default=1, help="time one rank's slice: each expert's intermediate / tp")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU, torch path only")
    p.add_argument("--json", metavar="PATH", help="also write the rows here")
    args = p.parse_args()
    if args.cpu_smoke:
        args.tokens, args.dtype = [1, 16, 128], "fp32"
    return args


def run_shape(shape: Shape, tokens: int, args, device: torch.device, timer) -> dict:
    dtype, I = DTYPES[args.dtype], shape.intermediate // args.tp
    gen = torch.Generator(device=device).manual_seed(0)
    w13 = torch.randn(shape.experts, 2 * I, shape.hidden, device=device, dtype=dtype, generator=gen) * 0.02
    w2 = torch.randn(shape.experts, shape.hidden, I, device=device, dtype=dtype, generator=gen) * 0.02
    hidden = torch.randn(tokens, shape.hidden, device=device, dtype=dtype, generator=gen)
    weights, ids = route(torch.randn(tokens, shape.experts, device=device, generator=gen), shape.top_k, True)
    row = {"shape": shape.name, "tokens": tokens}
    row["torch_ms"] = timer(lambda: torch_fused_experts(hidden, w13, w2, weights, ids)) * 1e3
    if device.type == "cuda":
        from minivllm.layers.fused_moe.triton_experts import triton_fused_experts

        expected = torch_fused_experts(hidden, w13, w2, weights, ids).float()
        actual = triton_fused_experts(hidden, w13, w2, weights, ids).float()
        row["max_err"] = (actual - expected).abs().max().item()
        row["triton_ms"] = timer(lambda: triton_fused_experts(hidden, w13, w2, weights, ids)) * 1e3
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
    return (
        f"{r['shape']:>14} {r['tokens']:>6} {r['torch_ms']:>9.3f} {triton_ms:>9} {speedup:>7} "
        f"{r['gflops']:>8.1f} {r['weight_gbs']:>8.2f} {err:>8}"
    )


def main() -> None:
    args = parse_args()
    device = torch.device("cpu" if args.cpu_smoke or not torch.cuda.is_available() else "cuda")
    timer = kernel_timer(device, runs=5)
    shapes = TINY if args.cpu_smoke else SHAPES
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
    if args.json:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        with open(args.json, "w") as f:
            json.dump({"device": name, "dtype": args.dtype, "tp": args.tp, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
