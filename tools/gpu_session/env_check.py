"""Stage (a) of tools/gpu_session.sh: is this machine ready for the GPU stages?

    python3 -m tools.gpu_session.env_check OUT_DIR [--cpu-try]

Checks, each a line of the log and a key of OUT_DIR/metrics.json: the GPU
(nvidia-smi and torch), the versions of torch, triton and transformers, what
Triton's launcher needs to build (a C compiler and Python.h), a tiny Triton
kernel run on the GPU (the launcher built for real), the ``minivllm/conf`` link
and the config tree it holds, free disk, which optional packages are installed
(tests needing a missing one are skipped), and the idle device's copy bandwidth
(1 GiB, CUDA events, read + write) and bf16 GEMM rate, the two rates of the bench's floor. Exits 1 when a check the later stages
need fails; with ``--cpu-try`` the GPU checks are skipped and reported so.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "triton", "transformers", "hydra-core", "omegaconf", "safetensors", "tokenizers", "numpy")
OPTIONAL = (
    "fastapi",
    "uvicorn",
    "xgrammar",
    "gguf",
    "tensorizer",
    "httpx",
    "openai",
    "jsonschema",
    "peft",
    "matplotlib",
    "cloudpickle",
    "prometheus_client",
)


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_info(cpu_try: bool) -> dict[str, Any]:
    smi = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    import torch

    out: dict[str, Any] = {"nvidia_smi": smi, "cuda_available": torch.cuda.is_available()}
    if out["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        out.update(
            gpu=props.name,
            gpu_memory_gib=props.total_memory / 2**30,
            sm_count=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            torch_cuda=torch.version.cuda,
        )
    out["ok"] = bool(smi) and out["cuda_available"] or cpu_try
    if cpu_try and not out["cuda_available"]:
        out["skipped"] = "CPU try: no CUDA device expected"
    return out


def device_rates(cpu_try: bool) -> dict[str, Any]:
    """Copy bandwidth and GEMM rate as ``minivllm.bench.timing`` measures them for the floor
    (the CPU try: small sizes on the CPU)."""
    import torch

    from minivllm.bench.timing import measure_copy_bandwidth, measure_gemm_rate

    cuda = torch.cuda.is_available() and not cpu_try
    device = torch.device("cuda" if cuda else "cpu")
    try:
        copy = measure_copy_bandwidth(device, None if cuda else 16 << 20)
        gemm = measure_gemm_rate(device, torch.bfloat16 if cuda else torch.float32, None if cuda else 128)
    except Exception as e:  # a broken device shows in the other checks; this records why
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    return {"device": str(device), "copy_bandwidth_gb_s": copy / 1e9, "gemm_tflop_s": gemm / 1e12}


def versions() -> dict[str, str | None]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    found["python"] = sys.version.split()[0]
    return found


def launcher_toolchain(cpu_try: bool) -> dict[str, Any]:
    """Triton compiles a small C launcher per kernel signature: it needs a C compiler and Python.h
    (not the interpreter of a CPU try, where a missing one is reported but not a failure)."""
    cc = next((c for c in ("gcc", "cc", "clang") if shutil.which(c)), None)
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    version = _run([cc, "--version"]) if cc else None
    found = bool(cc) and header.is_file()
    return {
        "compiler": cc,
        "compiler_version": version.splitlines()[0] if version else None,
        "python_h": str(header),
        "python_h_found": header.is_file(),
        "ok": found or cpu_try,
    }


def triton_smoke(cpu_try: bool) -> dict[str, Any]:
    """Build and run one tiny kernel on the GPU: the launcher compiles for real."""
    import torch

    if not torch.cuda.is_available():
        return {"ok": cpu_try, "skipped": "no CUDA device"}
    try:
        from minivllm.layers.ops.fused_rms_norm import rms_norm_

        x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
        w = torch.ones(256, device="cuda", dtype=torch.bfloat16)
        want = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
        rms_norm_(x, w, 1e-6)
        err = (x.float() - want.float()).abs().max().item()
        return {"ok": torch.allclose(x.float(), want.float(), rtol=2e-2, atol=1e-2), "max_abs_err": err}
    except Exception as e:  # noqa: BLE001 - the report names whatever broke
        return {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}


def conf_link() -> dict[str, Any]:
    """``minivllm/conf`` must lead to the YAML tree (a link to ../conf in the source tree)."""
    link = ROOT / "minivllm" / "conf"
    out: dict[str, Any] = {
        "path": str(link),
        "is_link": link.is_symlink(),
        "has_config": (link / "config.yaml").is_file(),
    }
    try:
        from minivllm.config.store import build_config

        cfg = build_config(["model=qwen3-0.6b", "load.format=dummy", "bench=nanovllm", "device=cpu"])
        out["composes"] = cfg.hf_config.num_hidden_layers == 28
    except Exception as e:  # noqa: BLE001
        out["composes"], out["error"] = False, f"{type(e).__name__}: {e}"
    out["ok"] = out["has_config"] and out["composes"]
    return out


def optional_packages() -> dict[str, bool]:
    """Which optional packages are installed (found, not imported: importing them all is slow)."""
    return {name: _installed(name) for name in OPTIONAL}


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken install counts as missing
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--cpu-try", action="store_true", help="no GPU expected: skip the GPU checks")
    args = p.parse_args(argv)
    disk = shutil.disk_usage(args.out_dir)
    checks = {
        "gpu": gpu_info(args.cpu_try),
        "launcher_toolchain": launcher_toolchain(args.cpu_try),
        "triton_kernel": triton_smoke(args.cpu_try),
        "conf": conf_link(),
    }
    metrics = {
        **checks,
        "versions": versions(),
        "free_disk_gib": disk.free / 2**30,
        "optional_packages": optional_packages(),
        "device_rates": device_rates(args.cpu_try),
        "failed_checks": [name for name, c in checks.items() if not c["ok"]],
    }
    for name, value in metrics.items():
        print(f"{name}: {json.dumps(value)}")
    (args.out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return 1 if metrics["failed_checks"] else 0


if __name__ == "__main__":
    sys.exit(main())
