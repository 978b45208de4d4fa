"""nano-vllm's own benchmark (its ``bench.py``, unmodified) on this machine, for a ratio with
minivllm's ``bench=nanovllm`` on nano-vllm's exact request instance in the same call.

    python3 -m tools.nanovllm_peer [--nanovllm DIR] [--model DIR] [--json PATH]

``--nanovllm`` (or ``$NANOVLLM_DIR``; default ``third_party/nano-vllm``, ignored by git) is a
nano-vllm checkout: its ``bench.py`` and ``nanovllm/``. ``--model`` (or ``$NANOVLLM_MODEL``) is
a Qwen3-0.6B checkpoint folder; without one, random weights of Qwen3-0.6B's shape
(``conf/model/qwen3-0.6b.yaml``, the shape minivllm's ``model=qwen3-0.6b load.format=dummy``
runs) and a small local tokenizer are written under ``--work`` (the prompts are token ids and
EOS is ignored, so neither changes the work). bench.py reads ``~/huggingface/Qwen3-0.6B/``:
it runs with ``HOME`` pointing at a folder whose ``huggingface/Qwen3-0.6B`` links to the
model (Triton's cache stays where it was).

nano-vllm imports ``flash_attn``, which the GPU machine cannot install: ``tools/peer/`` goes
first on its ``PYTHONPATH`` with a stand-in over minivllm's paged-attention kernel
(``tools/peer/flash_attn``), and ``tools/peer/fallback`` last, with an ``xxhash`` stand-in used
only where the real package is missing.

Prints bench.py's own line, then one machine-readable line::

    NANOVLLM_PEER {"output_tokens_per_s": ..., "total_tokens": ..., "time_s": ..., "instance_match": true, ...}

``instance_match``: bench.py's token total equals that of nano-vllm's instance as
``minivllm.bench.workloads.nanovllm_instance`` draws it (the instance minivllm replays).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / "tools" / "peer"
DEFAULT_CHECKOUT = ROOT / "third_party" / "nano-vllm"
PRESET = ROOT / "conf" / "model" / "qwen3-0.6b.yaml"
LINE = re.compile(r"Total: (\d+)tok, Time: ([\d.]+)s, Throughput: ([\d.]+)tok/s")
MARK = "NANOVLLM_PEER"


def find_checkout(path: str | None) -> Path:
    """The nano-vllm checkout: ``path``, else $NANOVLLM_DIR, else third_party/nano-vllm."""
    checkout = Path(path or os.environ.get("NANOVLLM_DIR") or DEFAULT_CHECKOUT).expanduser().resolve()
    if not (checkout / "bench.py").is_file() or not (checkout / "nanovllm").is_dir():
        raise SystemExit(
            f"nanovllm_peer: {checkout} is not a nano-vllm checkout (bench.py and nanovllm/); put one there "
            "(git clone https://github.com/GeeeekExplorer/nano-vllm third_party/nano-vllm) and name "
            "third_party/nano-vllm in the device call's carry (docs/gpu.md)"
        )
    return checkout


def build_checkpoint(out: Path, overrides: dict[str, Any] | None = None, device: str | None = None) -> Path:
    """Random weights of the qwen3-0.6b preset's shape (bf16, safetensors) and a small tokenizer."""
    import torch
    import yaml
    from transformers import AutoConfig, AutoModelForCausalLM

    from tools.tiny_vlm import train_tokenizer

    hf = dict(yaml.safe_load(PRESET.read_text())["hf_config"])
    hf.update(overrides or {})
    hf.pop("architectures", None)
    config = AutoConfig.for_model(hf.pop("model_type"), **hf)
    config.architectures = ["Qwen3ForCausalLM"]
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    train_tokenizer(out)
    return out


def bench_env(model: Path, work: Path, checkout: Path) -> dict[str, str]:
    """The environment bench.py runs in: HOME with ~/huggingface/Qwen3-0.6B -> model, the stand-ins
    around the checkout on PYTHONPATH, Triton's cache where it was."""
    home = work / "home"
    link = home / "huggingface" / "Qwen3-0.6B"
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(model.resolve(), target_is_directory=True)
    env = dict(os.environ)
    env.setdefault("TRITON_CACHE_DIR", str(Path.home() / ".triton" / "cache"))
    env["HOME"] = str(home)
    path = [str(PEER), str(checkout), str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join([*path, str(PEER / "fallback")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def parse(output: str) -> dict[str, Any] | None:
    """bench.py's result line as numbers (its last one), or None."""
    found = LINE.findall(output)
    if not found:
        return None
    total, seconds, rate = found[-1]
    return {"total_tokens": int(total), "time_s": float(seconds), "output_tokens_per_s": float(rate)}


def expected_total_tokens() -> int:
    from minivllm.bench.workloads import nanovllm_instance

    return sum(r.max_tokens for r in nanovllm_instance())


def run(checkout: Path, model: Path, work: Path, timeout: float | None) -> dict[str, Any]:
    env = bench_env(model, work, checkout)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(checkout / "bench.py")],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    (work / "bench_py.log").write_text(proc.stdout + proc.stderr)
    sys.stdout.write(proc.stdout)
    result = parse(proc.stdout)
    record: dict[str, Any] = {"status": "ok" if proc.returncode == 0 and result else f"exit {proc.returncode}"}
    record.update(result or {})
    record["wall_s"] = time.perf_counter() - start
    record["checkout"] = str(checkout)
    record["commit"] = _commit(checkout)
    if result:
        record["instance_match"] = result["total_tokens"] == expected_total_tokens()
    else:
        record["log_tail"] = (proc.stdout + proc.stderr)[-2000:]
    return record


def _commit(checkout: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nanovllm", help="nano-vllm checkout (default $NANOVLLM_DIR, else third_party/nano-vllm)")
    p.add_argument("--model", help="Qwen3-0.6B folder (default $NANOVLLM_MODEL, else random weights in --work)")
    p.add_argument("--work", help="folder for the random checkpoint, HOME and the log (default: a temp folder)")
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--timeout", type=float, default=None, help="seconds bench.py may take")
    args = p.parse_args(argv)
    checkout = find_checkout(args.nanovllm)
    work = Path(args.work or tempfile.mkdtemp(prefix="nanovllm-peer-"))
    work.mkdir(parents=True, exist_ok=True)
    model_arg = args.model or os.environ.get("NANOVLLM_MODEL")
    model = Path(model_arg) if model_arg else work / "Qwen3-0.6B"
    if not model_arg and not (model / "config.json").is_file():
        print(f"nanovllm_peer: writing random Qwen3-0.6B weights to {model}", flush=True)
        build_checkpoint(model)
    try:
        record = run(checkout, model, work, args.timeout)
    except subprocess.TimeoutExpired:
        record = {"status": f"timeout after {args.timeout} s", "checkout": str(checkout)}
    record["model"] = str(model)
    print(f"{MARK} {json.dumps(record)}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2))
    return 0 if record["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
