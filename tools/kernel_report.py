"""Compile every Triton kernel of the package for sm_80 and sm_90 without a GPU, and
report the registers, shared memory and register spills of each compiled variant.

    PYTHONPATH=. python -m tools.kernel_report                      # sm_80 and sm_90, a table
    PYTHONPATH=. python -m tools.kernel_report --arch 90 --json report.json --jobs 2
    PYTHONPATH=. python -m tools.kernel_report --kernels int4 sum_splits   # kernels named so

A variant is one launch of a kernel as its wrapper makes it for a benchmark shape on a
GPU of the architecture (``tools/kernel_variants.py`` builds them all); its arguments
(stand-in tensors of the right dtype and shape, integers and floats of the benchmark's
sizes) go through Triton's own launch-time specialization, so the compiled kernel is the one a launch on the GPU would compile
(16-byte-aligned pointers, integers divisible by 16 or equal to 1 specialized alike).
Variants that compile to the same kernel are merged. Each is compiled with
``triton.compile`` for ``GPUTarget("cuda", arch, 32)`` down to a cubin with the ptxas
that ships with Triton; ptxas ``-v`` is then run again on the PTX to read the registers
and spills, and the shared memory is the dynamic shared memory Triton will request
(``metadata.shared``).

A variant fails when it does not compile, spills registers (any spill store or load)
or needs more shared memory than one block may have on the architecture. A variant whose
configuration the engine refuses at start-up on the architecture (an fp8 KV cache below
sm_89: ``check_fp8_kv_capability``), or that its wrapper refuses there (the fp8 activation
quantization below sm_89, where fp8 linears never launch it: ``check_fp8_quant_capability``),
is not compiled but listed as refused, with the refusal's message; that is no failure.
Run this without ``TRITON_INTERPRET``: the kernels must be JITFunctions. The exit status is 1 when any variant fails.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import triton

from tools.kernel_variants import Variant, all_variants, capability

ARCHS = (80, 90)
SHARED_LIMIT = {  # bytes of shared memory one block may use (opt-in maximum)
    80: 166912,  # A100: 163 KiB
    90: 232448,  # H100: 227 KiB
}


def start_up_refusal(variant: Variant, arch: int) -> str:
    """The engine's start-up error for the variant's configuration on ``arch``; "" if it starts."""
    from minivllm.attention.ops.checks import check_fp8_kv_capability

    checks = [check_fp8_kv_capability] if variant.fp8_kv else []
    if variant.capability_check is not None:
        checks.append(variant.capability_check)
    for check in checks:
        try:
            check(capability(arch))
        except ValueError as e:
            return str(e)
    return ""


# --------------------------------------------------------------------------------------------
# Compiling and reading the resources.


@dataclass
class Bound:
    """A variant as Triton's launch path would hand it to ``triton.compile``."""

    kernel: Any
    labels: list[str]
    signature: dict
    constexprs: dict
    attrs: dict
    options: Any
    fp8_kv: bool = False  # any of the merged variants is

    def key(self) -> str:
        return repr(
            (
                self.kernel.fn.__name__,
                self.signature,
                sorted(self.constexprs.items()),
                sorted(self.attrs.items()),
                self.options,
            )
        )


def bind(variant: Variant, arch: int) -> Bound:
    """Triton's own launch-time specialization (``JITFunction.run``) applied to the variant's arguments."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = variant.kernel
    missing = set(kernel.arg_names) - set(variant.args)
    if missing:
        raise ValueError(f"{variant.kernel_name} {variant.label}: arguments {sorted(missing)} not given")
    backend = make_backend(GPUTarget("cuda", arch, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = {**variant.args, **variant.options}
    bound_args, specialization, options = binder(**kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, options)
    return Bound(kernel, [variant.label], signature, constexprs, attrs, options, variant.fp8_kv)


def ptxas_usage(ptx: str, arch: int, options) -> dict:
    """Registers, spills and stack of the kernel in ``ptx``, from ``ptxas -v`` run as Triton runs it."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        cmd = [
            get_ptxas(arch).path,
            "-lineinfo",
            "-v",
            "--regAllocOptLevel=2",
            *([] if options.enable_fp_fusion else ["--fmad=false"]),
            f"--gpu-name={sm_arch_from_capability(arch)}",
            str(src),
            "-o",
            str(Path(tmp) / "kernel.cubin"),
        ]
        log = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
    return parse_ptxas_log(log)


def parse_ptxas_log(log: str) -> dict:
    """The entry function's numbers from a ``ptxas -v`` log (the largest, should there be several)."""

    def largest(pattern: str) -> int:
        return max((int(v) for v in re.findall(pattern, log)), default=0)

    registers = re.findall(r"Used (\d+) registers", log)
    if not registers:
        raise ValueError(f"no register count in the ptxas log:\n{log}")
    return dict(
        registers=max(map(int, registers)),
        spill_stores=largest(r"(\d+) bytes spill stores"),
        spill_loads=largest(r"(\d+) bytes spill loads"),
        stack=largest(r"(\d+) bytes stack frame"),
    )


def compile_one(bound: Bound, arch: int) -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    row = dict(
        kernel=bound.kernel.fn.__name__,
        module=bound.kernel.fn.__module__,
        variant=" | ".join(bound.labels),
        arch=arch,
        num_warps=bound.options.num_warps,
        num_stages=bound.options.num_stages,
        shared_limit=SHARED_LIMIT[arch],
        registers=None,
        shared=None,
        spill_stores=None,
        spill_loads=None,
        stack=None,
        ok=False,
        result="failed",
        why="",
        fp8_kv=bound.fp8_kv,
    )
    start = time.perf_counter()
    try:
        src = ASTSource(bound.kernel, bound.signature, bound.constexprs, bound.attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=bound.options.__dict__)
        row["shared"] = compiled.metadata.shared
        row.update(ptxas_usage(compiled.asm["ptx"], arch, bound.options))
    except Exception as e:  # a kernel that does not compile is a result, not a crash
        message = getattr(e, "error_message", None) or str(e)  # CompilationError: without the kernel's source
        lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
        row["why"] = f"does not compile: {type(e).__name__}: {' / '.join(lines[:3])[:400]}"
    row["seconds"] = round(time.perf_counter() - start, 2)
    if row["registers"] is not None:
        problems = []
        if row["spill_stores"] or row["spill_loads"]:
            problems.append(f"spills {row['spill_stores']} B stored / {row['spill_loads']} B loaded")
        if row["shared"] > row["shared_limit"]:
            problems.append(f"shared memory {row['shared']} B > {row['shared_limit']} B")
        row["ok"], row["why"] = not problems, "; ".join(problems)
        row["result"] = "ok" if row["ok"] else "failed"
    return row


def refused_row(variant: Variant, arch: int, why: str) -> dict:
    """A variant the engine never launches on ``arch``: it refuses the configuration at start-up."""
    return dict(
        kernel=variant.kernel_name,
        module=variant.kernel.fn.__module__,
        variant=variant.label,
        arch=arch,
        num_warps=variant.options.get("num_warps"),
        num_stages=variant.options.get("num_stages"),
        shared_limit=SHARED_LIMIT[arch],
        registers=None,
        shared=None,
        spill_stores=None,
        spill_loads=None,
        stack=None,
        ok=False,
        result="refused",
        why=why,
        fp8_kv=variant.fp8_kv,
        seconds=0.0,
    )


def bound_variants(variants: list[Variant], arch: int) -> list[Bound]:
    """The variants bound for ``arch``, those that compile to the same kernel merged."""
    merged: dict[str, Bound] = {}
    for v in variants:
        b = bind(v, arch)
        if b.key() in merged:
            merged[b.key()].labels.append(v.label)
            merged[b.key()].fp8_kv |= b.fp8_kv
        else:
            merged[b.key()] = b
    return list(merged.values())


_JOBS: list[tuple[Bound, int]] = []  # inherited by forked workers


def _run_job(i: int) -> dict:
    return compile_one(*_JOBS[i])


def report(
    archs: tuple[int, ...] = ARCHS, jobs: int = 1, variants: Callable[[int], list[Variant]] = all_variants
) -> list[dict]:
    """A row per compiled kernel (variants merged) and per refused variant, for each arch;
    ``variants(arch)`` gives the launches on that architecture."""
    _JOBS.clear()
    refused = []
    for arch in archs:
        launched = []
        for v in variants(arch):
            why = start_up_refusal(v, arch)
            if why:
                refused.append(refused_row(v, arch, why))
            else:
                launched.append(v)
        _JOBS.extend((b, arch) for b in bound_variants(launched, arch))
    order = list(range(len(_JOBS)))
    if jobs <= 1:
        return [_run_job(i) for i in order] + refused
    # Attention kernels take longest: start them first so that the two workers end together.
    order.sort(key=lambda i: _JOBS[i][0].kernel.fn.__name__ != "_paged_attention_kernel")
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        rows = dict(zip(order, pool.map(_run_job, order, chunksize=1)))
    return [rows[i] for i in range(len(_JOBS))] + refused


def format_table(rows: list[dict]) -> str:
    head = ("kernel", "variant", "sm", "warps", "stages", "regs", "shared B", "limit B", "spill st/ld B", "s", "result")
    outcome = {
        "ok": lambda r: "ok",
        "failed": lambda r: f"FAIL: {r['why']}",
        "refused": lambda r: f"refused at start-up: {r['why']}",
    }
    body = [
        (
            r["kernel"],
            r["variant"],
            str(r["arch"]),
            str(r["num_warps"] or "-"),
            str(r["num_stages"] or "-"),
            "-" if r["registers"] is None else str(r["registers"]),
            "-" if r["shared"] is None else str(r["shared"]),
            str(r["shared_limit"]),
            "-" if r["spill_stores"] is None else f"{r['spill_stores']}/{r['spill_loads']}",
            f"{r['seconds']:.1f}",
            outcome[r["result"]](r),
        )
        for r in sorted(rows, key=lambda r: (r["kernel"], r["variant"], r["arch"]))
    ]
    widths = [max(len(row[i]) for row in (head, *body)) for i in range(len(head) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in (head, *body)]
    count = {result: sum(r["result"] == result for r in rows) for result in outcome}
    lines.append(
        f"{len(rows) - count['refused']} compiled variants, {count['failed']} failed; "
        f"{count['refused']} refused at start-up (not compiled)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--arch",
        type=int,
        nargs="+",
        default=list(ARCHS),
        choices=sorted(SHARED_LIMIT),
        help="compute capabilities to compile for",
    )
    p.add_argument("--json", metavar="PATH", help="also write the rows here")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="compiles in parallel")
    p.add_argument(
        "--kernels", nargs="+", metavar="PART", help="only the kernels whose function name contains one of these"
    )
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("unset TRITON_INTERPRET: the kernels must be compiled, not interpreted")
    start = time.perf_counter()
    variants = all_variants
    if args.kernels:
        parts = args.kernels

        def variants(arch: int) -> list[Variant]:
            return [v for v in all_variants(arch) if any(part in v.kernel.fn.__name__ for part in parts)]

    rows = report(tuple(args.arch), args.jobs, variants)
    print(format_table(rows))
    print(f"{time.perf_counter() - start:.1f} s with {args.jobs} job(s)")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(shared_limit=SHARED_LIMIT, rows=rows), indent=1) + "\n")
    return 1 if any(r["result"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
