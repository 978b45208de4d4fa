"""Every Triton kernel of the package compiled for sm_80 and sm_90 without a GPU.

``tools/kernel_report.py`` compiles each kernel the way its wrapper launches it at
the benchmark shapes, down to a cubin with the ptxas that ships with Triton, and
reports registers, shared memory and spills. The interpreter used on a CPU machine
accepts code the compiler rejects and says nothing about resources, so this runs the
report once, in a fresh process without ``TRITON_INTERPRET``, and fails a kernel for
an architecture when one of its variants does not compile, spills registers or needs
more shared memory than a block may have there. A variant the engine refuses at start-up
on an architecture (an fp8 KV cache below sm_89), or whose wrapper refuses it there (the
fp8 activation quantization below sm_89), is listed as refused instead of compiled, and
only such a variant may be. Kernels are found by reading the package's source: a
``@triton.jit`` function that is launched (``name[grid](...)``) must have variants in
the report, so a new kernel without any fails here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minivllm.attention.ops.checks import check_fp8_kv_capability
from minivllm.quantization.triton_fp8_gemm import check_fp8_gemm_capability
from minivllm.quantization.triton_fp8_quant import check_fp8_quant_capability

ROOT = Path(__file__).resolve().parents[2]
ARCHS = (80, 90)
JIT_DEF = re.compile(r"@triton\.jit(?:\([^)]*\))?\s*\ndef\s+(\w+)\s*\(")


def package_source() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "minivllm").rglob("*.py")))


def jit_functions(source: str) -> set[str]:
    return set(JIT_DEF.findall(source))


def launched_kernels(source: str) -> list[str]:
    """The @triton.jit functions launched somewhere (``name[grid](...)``); the others are
    device helpers, called from kernels (``_dot``, ``_tanh``, ``_round_to_e4m3``)."""
    return sorted(name for name in jit_functions(source) if re.search(rf"\b{name}\[", source))


KERNELS = launched_kernels(package_source())


def test_kernels_are_told_from_device_helpers() -> None:
    source = package_source()
    helpers = jit_functions(source) - set(KERNELS)
    assert {"_paged_attention_kernel", "_combine_splits_kernel", "_write_kv_kernel"} <= set(KERNELS)
    assert {"_dot", "_tanh", "_round_to_e4m3"} <= helpers
    for name in helpers:  # a helper is called by a kernel; one that is neither is dead code
        assert re.search(rf"(?<!def )\b{name}\(", source), f"@triton.jit {name} is neither launched nor called"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> list[dict]:
    """The report's rows for both architectures, from one run; its table is printed (pytest -s)."""
    out = tmp_path_factory.mktemp("kernel_report") / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "tools.kernel_report", "--arch", *map(str, ARCHS), "--json", str(out), "--jobs", "2"]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    print(f"\n$ {' '.join(cmd[1:])}\n{result.stdout}")
    # 0: every variant passed, 1: some failed (the tests below say which); anything else is a crash.
    assert result.returncode in (0, 1) and out.exists(), result.stderr[-4000:]
    return json.loads(out.read_text())["rows"]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: f"sm{a}")
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_compiles_without_spills_within_shared_memory(report: list[dict], kernel: str, arch: int) -> None:
    rows = [r for r in report if r["kernel"] == kernel and r["arch"] == arch]
    assert rows, f"{kernel} has no variant in tools/kernel_variants.py: add the launches its wrapper makes"
    failed = [
        f"{r['variant']}: regs {r['registers']}, shared {r['shared']}/{r['shared_limit']} B, "
        f"spills {r['spill_stores']}/{r['spill_loads']} B: {r['why']}"
        for r in rows
        if r["result"] == "failed"
    ]
    assert not failed, f"{kernel} on sm_{arch}:\n" + "\n".join(failed)
    for r in rows:
        assert r["result"] == ("refused" if expected_refusal(r, arch) else "ok"), r
        if r["result"] == "ok":  # what "ok" means, restated
            assert r["spill_stores"] == r["spill_loads"] == 0 and r["shared"] <= r["shared_limit"]
            assert 0 < r["registers"] <= 255
        else:  # refused: the engine's or the wrapper's own error, and nothing compiled
            assert r["why"] == expected_refusal(r, arch) and r["registers"] is None


def expected_refusal(row: dict, arch: int) -> str:
    """Why a report row must be refused on ``arch``; "" where it must compile."""
    if row["fp8_kv"]:
        return fp8_kv_refusal(arch)
    if row["kernel"] == "_fp8_quant_kernel":
        return refusal(check_fp8_quant_capability, arch)
    if row["kernel"] == "_fp8_gemm_kernel":
        return refusal(check_fp8_gemm_capability, arch)
    return ""


def refusal(check, arch: int) -> str:
    """``check``'s error for a GPU of ``arch``; "" where it passes."""
    try:
        check(divmod(arch, 10))
    except ValueError as e:
        return str(e)
    return ""


def fp8_kv_refusal(arch: int) -> str:
    """The start-up check's error for an fp8 KV cache on ``arch``; "" where it passes."""
    return refusal(check_fp8_kv_capability, arch)


def test_fp8_kv_refused_below_sm89() -> None:
    assert "cache.cache_dtype=fp8" in fp8_kv_refusal(80) and "this one is 8.0" in fp8_kv_refusal(80)
    assert fp8_kv_refusal(90) == ""


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: f"sm{a}")
def test_fp8_kv_variants_are_listed_as_refused_or_compiled(report: list[dict], arch: int) -> None:
    """Not dropped: both fp8 KV kernels have rows on every arch, refused exactly where the check refuses."""
    rows = [r for r in report if r["arch"] == arch and r["fp8_kv"]]
    assert {"_paged_attention_kernel", "_write_kv_kernel"} <= {r["kernel"] for r in rows}
    expected = "refused" if fp8_kv_refusal(arch) else "ok"
    assert all(r["result"] == expected for r in rows), [(r["variant"], r["result"], r["why"]) for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: f"sm{a}")
def test_fp8_quant_variants_are_refused_below_sm89_and_compiled_above(report: list[dict], arch: int) -> None:
    """The fp8 activation quantization at both bench input sizes, dynamic and static: refused
    on sm_80 (Triton has no float8_e4m3fn there; fp8 linears dequantize instead), compiled on sm_90."""
    rows = [r for r in report if r["arch"] == arch and r["kernel"] == "_fp8_quant_kernel"]
    labels = " | ".join(r["variant"] for r in rows)
    for hidden in (4096, 14336):
        for mode in ("dynamic", "static"):
            assert f"hidden {hidden} M=1..1024 {mode}" in labels, labels
    expected = "refused" if arch < 89 else "ok"
    assert all(r["result"] == expected for r in rows), [(r["variant"], r["result"], r["why"]) for r in rows]
