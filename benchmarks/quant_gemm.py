"""Time the quantized linear layers' GEMMs against the bf16 GEMM and their own torch references.

    PYTHONPATH=. python benchmarks/quant_gemm.py --json out.json   # CUDA: Llama-3-8B projection shapes
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/quant_gemm.py --cpu-smoke   # tiny shapes, CPU
    PYTHONPATH=. python benchmarks/quant_gemm.py --tune --tune-only   # CUDA: time int4 tiles, write the table

For each weight shape (K inputs, N outputs) and token count M, one row holds:

- ``bf16``: ``F.linear`` with the full-precision weight, the speed a quantized
  layer must beat (decode is bound by reading the weight, so 4 and 8 bits should
  win at small M);
- ``int4``: the Triton dequantize-GEMM of AWQ/GPTQ layers (group 128), and its
  torch reference (dequantize the whole weight, then matmul) as the engine's CPU
  path computes it;
- ``fp8``: ``torch._scaled_mm`` with dynamic per-token activation scales, the
  activation quantization (the fused Triton kernel) included, as
  ``Fp8LinearMethod`` runs it (CUDA, sm89+).

A second table times the fp8 activation quantization alone, the Triton kernel
against the torch ops it replaces (dynamic and static scales), and the fp8 linear
with either, and checks that both give the same fp8 bits (CUDA sm89+; the CPU
smoke runs the kernel through the interpreter).

Each quantized output is compared with the fp32 product of the same dequantized
weight (``err`` is the largest difference over the reference's largest value).
Weight GB/s counts the layer's stored weight bytes read once per call. The int4
``tiles`` are the config ``int4_matmul`` chose (``tuned`` where the tuned table gave it).

``--tune`` first times ``tune_candidates`` (minivllm/quantization/int4_tiles.py) at
``--tune-tokens`` for each shape and merges the winners into the tuned table
(``minivllm/tuned_tiles/tables/int4_gemm.json``, under this GPU's name); then, on an
sm89+ GPU, ``torch._scaled_mm`` against the Triton fp8 GEMM's candidates
(``triton_fp8_gemm.tune_candidates``), the winner per shape and M into ``fp8_gemm.json``
(which GEMM a bf16 fp8 linear runs); then runs the benchmark, which now reads the tables
(``--tune-only``: no benchmark). The fp8 columns give the layer's pick, and
``_scaled_mm`` and the Triton GEMM each against bf16.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from minivllm.bench.timing import kernel_timer
from minivllm.layers.linear import ReplicatedLinear
from minivllm.quantization.awq import AWQLinearMethod
from minivllm.quantization.fp8 import FP8, Fp8LinearMethod, _fp8_matmul, _scaled_mm_usable, _triton_gemm
from minivllm.quantization.int4 import dequantize

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/, when run as a script
from tools.gemm_tune import add_tune_arguments, check_tune_arguments  # noqa: E402


@dataclass(frozen=True)
class Shape:
    name: str
    k: int  # input features
    n: int  # output features


SHAPES = [  # Llama-3-8B's projections
    Shape("qkv 4096->6144", 4096, 6144),
    Shape("o 4096->4096", 4096, 4096),
    Shape("up 4096->14336", 4096, 14336),
    Shape("down 14336->4096", 14336, 4096),
]
TINY = [Shape("tiny 64->32", 64, 32)]
GROUP = 128
TOKENS = [1, 16, 128, 1024]
TUNE_TOKENS = TOKENS  # the table's M buckets


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (int4 through the interpreter)")
    p.add_argument("--json", metavar="PATH", help="also write the rows here")
    add_tune_arguments(p, "the int4 tiles", TUNE_TOKENS, 35.0)
    args = p.parse_args(argv)
    check_tune_arguments(p, args)
    if args.cpu_smoke:
        args.tokens = [1, 16]
    return args


def int4_layer(shape: Shape, device: torch.device, gen: torch.Generator) -> ReplicatedLinear:
    """An AWQ layer with random packed weights and zeros, converted to the common layout."""
    layer = ReplicatedLinear(shape.k, shape.n, bias=False)
    layer.set_quant_method(AWQLinearMethod(GROUP if shape.k % GROUP == 0 else 32), torch.bfloat16)
    for name in ("qweight", "qzeros"):
        p = getattr(layer, name)
        p.data.copy_(torch.randint(-(2**31), 2**31 - 1, p.shape, dtype=torch.int32, generator=gen))
    layer.scales.data.copy_(torch.rand(layer.scales.shape, generator=gen) * 0.01)
    layer.quant_method.process_weights_after_loading(layer)
    return layer.to(device)


def fp8_layer(weight: torch.Tensor) -> ReplicatedLinear:
    """A dynamic-activation fp8 layer holding ``weight`` (out, in) quantized per output row."""
    layer = ReplicatedLinear(weight.shape[1], weight.shape[0], bias=False)
    layer.set_quant_method(Fp8LinearMethod(static_input=False), torch.bfloat16)
    layer = layer.to(weight.device)
    scale = weight.float().abs().amax(dim=1) / torch.finfo(FP8).max
    layer.weight.data.copy_((weight.float() / scale[:, None]).to(FP8))
    layer.weight_scale.data.copy_(scale)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def rel_err(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out.float() - reference).abs().max() / reference.abs().max().clamp(min=1e-12)).item()


def run_shape(shape: Shape, tokens: int, device: torch.device, timer, dtype: torch.dtype) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, shape.k, generator=gen).to(device, dtype)
    weight = (torch.randn(shape.n, shape.k, generator=gen) * 0.02).to(device, dtype)  # (out, in)
    row: dict = {"shape": shape.name, "tokens": tokens}
    row["bf16_ms"] = timer(lambda: F.linear(x, weight)) * 1e3
    row["bf16_weight_gbs"] = weight.numel() * weight.element_size() / row["bf16_ms"] / 1e6

    layer = int4_layer(shape, device, gen)
    w4 = dequantize(layer.qweight, layer.scales, layer.zeros, layer.g_idx, torch.float32)  # (K, N)
    int4_bytes = sum(t.numel() * t.element_size() for t in (layer.qweight, layer.scales, layer.zeros, layer.g_idx))
    row["int4_torch_ms"] = (
        timer(lambda: x @ dequantize(layer.qweight, layer.scales, layer.zeros, layer.g_idx, dtype)) * 1e3
    )
    if device.type == "cuda" or _interpreted():
        from minivllm.quantization import int4_tiles
        from minivllm.quantization.triton_int4 import int4_matmul
        from minivllm.tuned_tiles import device_facts, lookup

        facts, dtype_name = device_facts(device), str(dtype).removeprefix("torch.")
        group, w = layer.int4_group_size, (layer.qweight, layer.scales, layer.zeros, layer.g_idx)
        chosen = int4_tiles.choose_tiles(tokens, shape.n, shape.k, group, dtype_name, facts)
        tuned = lookup(int4_tiles.KERNEL, facts.name, int4_tiles.shape_key(shape.n, shape.k, group, dtype_name), tokens)
        row["int4_tiles"] = chosen.name + (" tuned" if tuned is not None else "")
        reference = x.float() @ w4
        for key, group_size in (("int4", group), ("int4_act_order", 0)):  # the fast path; the general one
            run = lambda g=group_size: int4_matmul(x, *w, group_size=g)  # noqa: E731
            row[f"{key}_err"] = rel_err(run(), reference)
            row[f"{key}_ms"] = timer(run) * 1e3
        row["int4_weight_gbs"] = int4_bytes / row["int4_ms"] / 1e6
    del w4

    if device.type == "cuda" and _scaled_mm_usable(x, weight):
        fp8 = fp8_layer(weight)
        reference = x.float() @ fp8.quant_method.dequantize(fp8, torch.float32).t()
        row["fp8_err"] = rel_err(fp8(x), reference)
        row["fp8_ms"] = timer(lambda: fp8(x)) * 1e3  # the layer's pick: _scaled_mm unless the table says Triton
        row["fp8_weight_gbs"] = fp8.weight.numel() / row["fp8_ms"] / 1e6
        row["fp8_scaled_mm_ms"] = timer(lambda: _fp8_matmul(x, fp8, None)) * 1e3
        row["fp8_triton_err"] = rel_err(_fp8_matmul(x, fp8, None, gemm=_triton_gemm), reference)
        row["fp8_triton_ms"] = timer(lambda: _fp8_matmul(x, fp8, None, gemm=_triton_gemm)) * 1e3
    return row


def run_fp8_quant(shape: Shape, tokens: int, device: torch.device, timer, dtype: torch.dtype) -> dict | None:
    """The fp8 activation quantization of (tokens, K) activations: the fused kernel against
    the torch reference, alone (dynamic and static scales) and inside the fp8 linear; None
    where the kernel does not run (a GPU below sm89, or a CPU without the interpreter)."""
    from minivllm.quantization.triton_fp8_quant import quantize_activations, quantize_fp8_rows

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, shape.k, generator=gen).to(device, dtype)  # (M, K)
    weight = (torch.randn(shape.n, shape.k, generator=gen) * 0.02).to(device, dtype)  # (N, K)
    gemm = _scaled_mm_usable(x, weight)  # CUDA sm89+: where fp8 linears quantize activations
    if not (gemm or (device.type == "cpu" and _interpreted())):
        return None
    static = torch.tensor([x.float().abs().max().item() / 448], device=device)
    row: dict = {"shape": shape.name, "tokens": tokens, "same_bits": True}
    for mode, scale in (("dynamic", None), ("static", static)):
        fused, reference = quantize_fp8_rows(x, scale), quantize_activations(x, scale)
        row["same_bits"] &= torch.equal(fused[0].view(torch.uint8), reference[0].view(torch.uint8))
        row["same_bits"] &= torch.equal(fused[1], reference[1])
        row[f"{mode}_torch_ms"] = timer(lambda s=scale: quantize_activations(x, s)) * 1e3
        row[f"{mode}_fused_ms"] = timer(lambda s=scale: quantize_fp8_rows(x, s)) * 1e3
    if gemm:
        layer = fp8_layer(weight)
        row["linear_torch_quant_ms"] = timer(lambda: _fp8_matmul(x, layer, None, quantize_activations)) * 1e3
        row["linear_fused_quant_ms"] = timer(lambda: _fp8_matmul(x, layer, None)) * 1e3
    return row


def format_fp8_quant_row(r: dict) -> str:
    def pair(mode: str) -> str:
        torch_ms, fused_ms = r.get(f"{mode}_torch_ms"), r.get(f"{mode}_fused_ms")
        return "- | - | -" if torch_ms is None else f"{torch_ms:.4f} | {fused_ms:.4f} | {torch_ms / fused_ms:.2f}x"

    linear = (
        f"{r['linear_torch_quant_ms']:.4f} | {r['linear_fused_quant_ms']:.4f}"
        if "linear_fused_quant_ms" in r
        else "- | -"
    )
    return f"| {r['shape']} | {r['tokens']} | {pair('dynamic')} | {pair('static')} | {linear} | {r['same_bits']} |"


def print_fp8_quant_table(tokens: list[int], shapes: list[Shape], device: torch.device, timer, dtype) -> list[dict]:
    """The second table (module docstring): one row per shape and token count."""
    print("\nfp8 activation quantization: torch ops against the fused Triton kernel (ratio: torch / fused)")
    print(
        "| weight (K->N) | M | dynamic torch ms | dynamic fused ms | speed-up | static torch ms | static fused ms "
        "| speed-up | fp8 linear, torch quant ms | fp8 linear, fused quant ms | same bits |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    rows = []
    for shape in shapes:
        for m in tokens:
            row = run_fp8_quant(shape, m, device, timer, dtype)
            if row is None:
                print("(the kernel does not run here: it needs a GPU of compute capability 8.9+ or the interpreter)")
                return rows
            rows.append(row)
            print(format_fp8_quant_row(row), flush=True)
    return rows


def tune(args, device: torch.device) -> None:
    """Time each shape's int4 candidates at the tune token counts; merge the winners into the table."""
    from minivllm.quantization import int4_tiles
    from minivllm.quantization.triton_int4 import int4_matmul
    from minivllm.tuned_tiles import device_facts, merge_entries, table_path
    from tools.gemm_tune import Budget, compile_failures, report_line, time_candidates
    from tools.kernel_variants import int4_launch_variant

    facts = device_facts(device)
    table = args.table or table_path(int4_tiles.KERNEL)

    def candidates(shape: Shape, m: int) -> list:
        return int4_tiles.tune_candidates(m, shape.n, shape.k, facts.arch, facts.num_sms)

    plan = {
        (shape.name, m, c): [int4_launch_variant(shape, m, c)]
        for shape in SHAPES
        for m in args.tune_tokens
        for c in candidates(shape, m)
    }
    failures = compile_failures(plan, facts.arch)
    for shape in SHAPES:
        budget = Budget(args.tune_budget_s / (2 * len(SHAPES)))  # an equal share for each shape; half is fp8's
        gen = torch.Generator().manual_seed(0)
        layer = int4_layer(shape, device, gen)
        w4 = dequantize(layer.qweight, layer.scales, layer.zeros, layer.g_idx, torch.float32)  # (K, N)
        winners = {}
        for m in args.tune_tokens:
            if budget.spent():
                print(f"tune {shape.name} M={m}: budget spent, the heuristic stays")
                winners[m] = None  # a null bucket: nearer Ms take the heuristic, not a farther bucket
                continue
            x = torch.randn(m, shape.k, generator=gen).to(device, torch.bfloat16)
            result = time_candidates(
                shape.name,
                m,
                candidates(shape, m),
                lambda c, x=x, w=(layer.qweight, layer.scales, layer.zeros, layer.g_idx), g=layer.int4_group_size: (
                    int4_matmul(x, *w, tiles=c, group_size=g)
                ),
                x.float() @ w4,
                {c: why for (name, mm, c), why in failures.items() if (name, mm) == (shape.name, m)},
            )
            print(report_line(result, candidates(shape, m)[0].name), flush=True)
            winners[m] = None if result.best is None else result.best.as_dict()
        del w4
        if winners:
            key = int4_tiles.shape_key(shape.n, shape.k, layer.int4_group_size, "bfloat16")
            merge_entries(table, int4_tiles.KERNEL, facts.name, key, winners)
            tuned = sum(cfg is not None for cfg in winners.values())
            print(f"tune: {tuned} of {len(winners)} buckets of {key} on {facts.name} written to {table}")


@dataclass(frozen=True)
class ScaledMm:
    """The ``torch._scaled_mm`` candidate among the fp8 GEMM's Triton tiles."""

    name: str = "scaled_mm"

    def as_dict(self) -> dict:
        return {"backend": "scaled_mm"}


def tune_fp8(args, device: torch.device) -> None:
    """Time ``_scaled_mm`` against the Triton fp8 GEMM's candidates at the tune token counts
    (bf16, the fused activation quantization included in both); merge the winners into the
    fp8 table (``{"backend": "scaled_mm"}`` or ``{"backend": "triton", <tiles>}``)."""
    from minivllm.quantization import triton_fp8_gemm as fg
    from minivllm.tuned_tiles import device_facts, merge_entries, table_path
    from tools.gemm_tune import Budget, compile_failures, report_line, time_candidates
    from tools.kernel_variants import fp8_gemm_launch_variant

    facts = device_facts(device)
    gen = torch.Generator().manual_seed(0)
    probe = torch.zeros(16, 16, device=device, dtype=torch.bfloat16)
    if not _scaled_mm_usable(probe, probe):
        print("tune fp8: this GPU has no fp8 GEMM (compute capability 8.9+): nothing to tune")
        return
    table = (args.table.parent / f"{fg.KERNEL}.json") if args.table else table_path(fg.KERNEL)

    def candidates(shape: Shape, m: int) -> list:
        return [ScaledMm(), *fg.tune_candidates(m, shape.n, shape.k, facts.arch, facts.num_sms)]

    plan = {
        (shape.name, m, c): [fp8_gemm_launch_variant(shape, m, c, torch.bfloat16)]
        for shape in SHAPES
        for m in args.tune_tokens
        for c in candidates(shape, m)[1:]
    }
    failures = compile_failures(plan, facts.arch)
    for shape in SHAPES:
        budget = Budget(args.tune_budget_s / (2 * len(SHAPES)))  # half the budget is int4's
        weight = (torch.randn(shape.n, shape.k, generator=gen) * 0.02).to(device, torch.bfloat16)
        layer = fp8_layer(weight)
        w = layer.quant_method.dequantize(layer, torch.float32).t()  # (K, N)
        winners = {}
        for m in args.tune_tokens:
            if budget.spent():
                print(f"tune fp8 {shape.name} M={m}: budget spent, _scaled_mm stays")
                winners[m] = None
                continue
            x = torch.randn(m, shape.k, generator=gen).to(device, torch.bfloat16)

            def run(c, x=x, layer=layer):
                if isinstance(c, ScaledMm):
                    return _fp8_matmul(x, layer, None)
                return _fp8_matmul(x, layer, None, gemm=lambda *a: _triton_gemm(*a, tiles=c))

            found = {c: why for (name, mm, c), why in failures.items() if (name, mm) == (shape.name, m)}
            result = time_candidates(f"fp8 {shape.name}", m, candidates(shape, m), run, x.float() @ w, found)
            print(report_line(result, ScaledMm().name), flush=True)
            best = result.best
            if best is None or isinstance(best, ScaledMm):
                winners[m] = None if best is None else best.as_dict()
            else:
                winners[m] = {"backend": "triton", **best.as_dict()}
        key = fg.shape_key(shape.n, shape.k, "bfloat16")
        merge_entries(table, fg.KERNEL, facts.name, key, winners)
        print(
            f"tune: {sum(v is not None for v in winners.values())} of {len(winners)} buckets of {key} written to {table}"
        )


def _interpreted() -> bool:
    from minivllm.attention.ops.checks import is_interpreted
    from minivllm.quantization.triton_int4 import _int4_matmul_kernel

    return is_interpreted(_int4_matmul_kernel)


def format_row(r: dict) -> str:
    def cell(key: str, fmt: str) -> str:
        return format(r[key], fmt) if key in r else "-"

    def ratio(key: str) -> str:
        return f"{r['bf16_ms'] / r[key]:.2f}x" if key in r else "-"

    return (
        f"| {r['shape']} | {r['tokens']} | {r['bf16_ms']:.4f} | {cell('int4_ms', '.4f')} | {ratio('int4_ms')} "
        f"| {cell('int4_act_order_ms', '.4f')} | {ratio('int4_act_order_ms')} "
        f"| {r['int4_torch_ms']:.4f} | {cell('fp8_ms', '.4f')} | {ratio('fp8_ms')} "
        f"| {ratio('fp8_scaled_mm_ms')} / {ratio('fp8_triton_ms')} "
        f"| {r['bf16_weight_gbs']:.0f} / {cell('int4_weight_gbs', '.0f')} / {cell('fp8_weight_gbs', '.0f')} "
        f"| {cell('int4_err', '.1e')} / {cell('fp8_err', '.1e')} | {r.get('int4_tiles', '-')} |"
    )


GOALS = (("int4_ms", "int4", 2.0), ("fp8_ms", "fp8", 1.5))
"""(timing key, name, least bf16 / quantized ratio at M <= GOAL_MAX_M on every shape)."""
GOAL_MAX_M = 16


def goal_lines(rows: list[dict]) -> list[str]:
    """One line per goal: the smallest ratio over the rows at M <= GOAL_MAX_M, met or not."""
    out = []
    for key, name, goal in GOALS:
        ratios = [(r["bf16_ms"] / r[key], r) for r in rows if key in r and r["tokens"] <= GOAL_MAX_M]
        if not ratios:
            out.append(f"goal {name} >= {goal}x bf16 at M <= {GOAL_MAX_M}: not measured here")
            continue
        worst, r = min(ratios, key=lambda p: p[0])
        verdict = "met" if worst >= goal else "NOT met"
        out.append(
            f"goal {name} >= {goal}x bf16 at M <= {GOAL_MAX_M}: smallest {worst:.2f}x "
            f"({r['shape']}, M={r['tokens']}) over {len(ratios)} rows: {verdict}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device("cpu" if args.cpu_smoke or not torch.cuda.is_available() else "cuda")
    if args.tune:
        tune(args, device)
        tune_fp8(args, device)
        if args.tune_only:
            return 0
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    timer = kernel_timer(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device={name} dtype={dtype} int4 group={GROUP}; ratios are bf16 time / quantized time")
    print(
        "| weight (K->N) | M | bf16 ms | int4 ms | int4 vs bf16 | int4 act-order ms | act-order vs bf16 "
        "| int4 torch ms | fp8 ms | fp8 vs bf16 | fp8 _scaled_mm / Triton vs bf16 | weight GB/s bf16 / int4 / fp8 "
        "| err int4 / fp8 | int4 tiles |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    rows = []
    for shape in TINY if args.cpu_smoke else SHAPES:
        for tokens in args.tokens:
            rows.append(run_shape(shape, tokens, device, timer, dtype))
            print(format_row(rows[-1]), flush=True)
    for line in goal_lines(rows):
        print(line)
    shapes = TINY if args.cpu_smoke else SHAPES
    fp8_quant_rows = print_fp8_quant_table(args.tokens, shapes, device, timer, dtype)
    if args.json:
        with open(args.json, "w") as f:
            result = {"device": name, "dtype": str(dtype), "group": GROUP, "rows": rows}
            json.dump({**result, "fp8_quant_rows": fp8_quant_rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
