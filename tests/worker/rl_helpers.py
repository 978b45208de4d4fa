"""Helpers for the RL tests: a perturbed copy of a checkpoint, a "trainer" process that
broadcasts it, and what a worker measures of its own memory (run through collective_rpc,
so they live in an importable module)."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from minivllm.distributed.stateless_group import StatelessGroup
from minivllm.worker.sleep import weight_bytes

EXTENSION = "minivllm.worker.weight_update.WeightUpdateExtension"


def perturbed_copy(src: Path, out: Path, scale: float = 0.5, seed: int = 1) -> Path:
    """``src`` with every weight moved by ``scale`` times its own standard deviation of noise."""
    shutil.copytree(src, out)
    gen = torch.Generator().manual_seed(seed)
    for path in sorted(out.glob("*.safetensors")):
        state = load_file(path)
        for name, t in state.items():
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32) * t.float().std().clamp(min=1e-3)
            state[name] = (t.float() + scale * noise).to(t.dtype)
        save_file(state, path, metadata={"format": "pt"})
    return out


def checkpoint_tensors(path: Path) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of the checkpoint, in name order (the order the trainer sends them)."""
    state: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        state.update(load_file(f))
    return sorted(state.items())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_main(checkpoint: str, port: int, world_size: int) -> None:
    """A trainer process: member 0 of the weight-sync group; broadcasts every tensor of ``checkpoint``."""
    torch.set_num_threads(1)
    group = StatelessGroup.create("127.0.0.1", port, 0, world_size)
    for _, tensor in checkpoint_tensors(Path(checkpoint)):
        group.broadcast(tensor.contiguous(), src=0)
    group.close()  # returns once every worker closed too


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_report(worker) -> dict[str, int]:
    """Runs in a worker: its process's resident set, and the bytes its KV cache and weights hold."""
    runner = worker.model_runner
    return {
        "pid": os.getpid(),
        "rss": rss_bytes(),
        "kv_bytes": sum(t.untyped_storage().nbytes() for t in runner.kv_caches),
        "weight_bytes": weight_bytes(runner.model),
    }


def memory(llm) -> list[dict[str, int]]:
    """Each rank's ``memory_report``, measured in its own process."""
    return llm.collective_rpc(memory_report)


def assert_released(before: list[dict], after: list[dict], weights: bool) -> None:
    """Each rank's KV cache (and, with ``weights``, its weights) freed, and its process shrunk by the KV's size."""
    for b, a in zip(before, after, strict=True):
        assert b["pid"] == a["pid"]
        assert b["kv_bytes"] >= (16 << 20) and a["kv_bytes"] == 0
        assert b["rss"] - a["rss"] >= 0.8 * b["kv_bytes"], (b, a)  # the process really shrank
        assert a["weight_bytes"] == (0 if weights else b["weight_bytes"])
