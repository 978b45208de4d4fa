"""The CPU's fp32 GEMMs for a decoder's linear layers, weights streaming from memory as in a decode step:
oneDNN's matmul on its reordered weight, minivllm's panel GEMM (``quantization/cpu_panel_gemm.py``) and,
at a few rows, the kernel on the plain weight (``quantization/cpu_small_gemm.py``).

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/cpu_gemm.py [--threads 1] [--rows 1,2,4,8,16,32,64,256,2048]

The shapes are one layer of the issue's 768-hidden Llama (QKV 1280 x 768, O 768 x 768, gate/up 4096 x
768, down 768 x 2048), ``--layers`` copies of each (12: 302 MB, far more than the last-level cache), run
layer after layer as a forward pass does, so every weight comes from memory. Printed per row count: each
kernel's GFLOP/s (2 * rows * weights / time, the median of ``--repeats`` passes) and its weight bytes per
second, and the panel GEMM's speed-up over oneDNN.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minivllm.quantization import cpu_panel_gemm, cpu_small_gemm

SHAPES = [(1280, 768), (768, 768), (4096, 768), (768, 2048)]  # (out, in) of QKV, O, gate/up, down


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rows", default="1,2,4,8,16,24,32,64,256,2048")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if cpu_panel_gemm.load() is None or cpu_small_gemm.load() is None:
        raise SystemExit("the C kernels did not build (no C compiler?)")
    gen = torch.Generator().manual_seed(0)
    weights = [[torch.randn(s, generator=gen) * 0.02 for s in SHAPES] for _ in range(args.layers)]
    plain = [[cpu_small_gemm.to_huge_pages(w) for w in layer] for layer in weights]
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w, 32) for w in layer] for layer in weights]
    panels = [[cpu_panel_gemm.pack_panels(w) for w in layer] for layer in weights]
    numel = args.layers * sum(o * i for o, i in SHAPES)
    kernels = {
        "oneDNN": lambda x, layer, j: torch.ops.mkldnn._linear_pointwise(x, onednn[layer][j], None, "none", [], ""),
        "panels": lambda x, layer, j: cpu_panel_gemm.panel_linear(x, panels[layer][j], None),
        "plain": lambda x, layer, j: cpu_small_gemm.small_linear(x, plain[layer][j], None),
    }
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {args.layers} layers, {numel * 4 / 1e6:.0f} MB of weights"
    )
    print(f"{'rows':>5} " + "".join(f"{name + ' GFLOP/s (GB/s)':>26}" for name in kernels) + "   panels / oneDNN")
    for rows in (int(r) for r in args.rows.split(",")):
        xs = [torch.randn(rows, i, generator=gen) for _, i in SHAPES]
        seconds = {}
        for name, run in kernels.items():
            if name == "plain" and rows > cpu_small_gemm.SMALL_ROWS:
                continue

            def one_pass(run=run, xs=xs) -> float:
                start = time.perf_counter()
                for layer in range(args.layers):
                    for j, x in enumerate(xs):
                        run(x, layer, j)
                return time.perf_counter() - start

            one_pass()  # warm-up
            seconds[name] = statistics.median(one_pass() for _ in range(args.repeats))
        cells = "".join(
            f"{2 * rows * numel / s / 1e9:>14.1f} ({numel * 4 / s / 1e9:>5.1f} GB/s)"
            if (s := seconds.get(n))
            else f"{'-':>26}"
            for n in kernels
        )
        print(f"{rows:>5} {cells}   {seconds['oneDNN'] / seconds['panels']:.2f}x")


if __name__ == "__main__":
    main()
