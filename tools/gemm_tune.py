"""The ``--tune`` mode of benchmarks/moe.py and benchmarks/quant_gemm.py: time a small set of
tile configs per shape and token count on this GPU and write the winners to the tuned table.

Before timing, every candidate is compiled for this GPU's architecture with
``tools/kernel_report.py``'s machinery and dropped if it does not compile, spills
registers or needs more shared memory than a block may have; a candidate whose output
is off the reference by more than ``MAX_REL_ERR`` of the reference's largest value is
dropped too. The table is written after each shape, so a stage cut short by its time
limit keeps what it finished.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

MAX_REL_ERR = 5e-2  # bf16 paths differ by ~1% of the largest output; a wrong tile mapping by ~100%


@dataclass
class TuneResult:
    label: str
    tokens: int
    timings: dict[str, float] = field(default_factory=dict)  # config name -> ms
    dropped: dict[str, str] = field(default_factory=dict)  # config name -> why
    best: object = None


def compile_failures(variants_of: dict[object, list], arch: int, jobs: int = 8) -> dict[object, str]:
    """config -> why, for the configs whose launches (``tools.kernel_variants.Variant``) fail to compile on
    sm_``arch`` without spills within shared memory; {} where all pass. Architectures the report
    has no shared-memory limit for are not checked (a line says so)."""
    from tools import kernel_report

    if arch not in kernel_report.SHARED_LIMIT:
        print(f"tune: no compile check for sm_{arch} (kernel_report knows {sorted(kernel_report.SHARED_LIMIT)})")
        return {}
    owner = {v.label: config for config, variants in variants_of.items() for v in variants}
    flat = [v for variants in variants_of.values() for v in variants]
    rows = kernel_report.report((arch,), jobs, variants=lambda a: flat)
    failed: dict[object, str] = {}
    for row in rows:
        if row["result"] != "ok":
            for label in row["variant"].split(" | "):
                failed[owner[label]] = row["why"]
    return failed


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out.float() - reference.float()).abs().max() / reference.float().abs().max().clamp(min=1e-12)).item()


def quick_timer(fn: Callable[[], object]) -> float:
    """Median ms of ``fn`` over a short run: enough to rank configs that differ by > 5%."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=25, return_mode="median")


def time_candidates(
    label: str,
    tokens: int,
    candidates: list,
    run: Callable[[object], torch.Tensor],
    reference: torch.Tensor,
    failures: dict[object, str],
    timer: Callable[[Callable[[], object]], float] | None = None,
) -> TuneResult:
    """Check and time each candidate (``run(config)`` computes the product with it); the best
    is the fastest that compiled cleanly and matched ``reference``. ``timer`` None: ``quick_timer``."""
    result, timer = TuneResult(label, tokens), timer or quick_timer
    for config in candidates:
        if config in failures:
            result.dropped[config.name] = failures[config]
            continue
        err = relative_error(run(config), reference)
        if err > MAX_REL_ERR:
            result.dropped[config.name] = f"relative error {err:.1e} > {MAX_REL_ERR}"
            continue
        result.timings[config.name] = timer(lambda config=config: run(config))
        if result.best is None or result.timings[config.name] < result.timings[result.best.name]:
            result.best = config
    return result


def report_line(result: TuneResult, heuristic_name: str) -> str:
    """One line per (shape, tokens): each config's ms, the winner and its gain on the heuristic."""
    cells = [f"{name} {ms:.4f}" for name, ms in sorted(result.timings.items(), key=lambda kv: kv[1])]
    cells += [f"{name} dropped ({why})" for name, why in result.dropped.items()]
    if result.best is None:
        return f"tune {result.label} M={result.tokens}: no candidate passed; " + "; ".join(cells)
    base = result.timings.get(heuristic_name)
    gain = f", {base / result.timings[result.best.name]:.2f}x the heuristic's" if base else ""
    return f"tune {result.label} M={result.tokens}: best {result.best.name}{gain}; " + "; ".join(cells)


class Budget:
    """Seconds left for tuning: shapes and token counts past it are left to the heuristic."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def spent(self) -> bool:
        return time.monotonic() > self.deadline


def add_tune_arguments(p: argparse.ArgumentParser, what: str, tokens: list[int], budget_s: float) -> None:
    """The ``--tune`` options a kernel benchmark takes (``what``: the tiles it tunes; ``tokens``:
    the table's M buckets)."""
    p.add_argument("--tune", action="store_true", help=f"CUDA: tune {what} first and write the tuned table")
    p.add_argument("--tune-only", action="store_true", help="with --tune: no benchmark afterwards")
    p.add_argument("--tune-tokens", type=int, nargs="+", default=tokens, help="the M buckets to tune")
    p.add_argument(
        "--tune-budget-s",
        type=float,
        default=budget_s,
        help="shared by the shapes; token counts past a shape's share keep the heuristic",
    )
    p.add_argument("--table", type=Path, help="the tuned table to write (default: the package's)")


def check_tune_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``p.error`` for ``--tune`` options that cannot run here."""
    if args.tune_only and not args.tune:
        p.error("--tune-only needs --tune")
    if args.tune and (args.cpu_smoke or not torch.cuda.is_available()):
        p.error("--tune times Triton kernels: it needs a CUDA device (and no --cpu-smoke)")
