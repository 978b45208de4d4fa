"""Finding and reading checkpoint weight files (safetensors or torch pickles).

Safetensors tensors are yielded as lazy slices, so a tensor-parallel rank reads
only its shard from the memory-mapped file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import safe_open

SAFETENSORS_INDEX = "model.safetensors.index.json"
PT_INDEX = "pytorch_model.bin.index.json"


def find_weight_files(checkpoint: Path, load_format: str) -> tuple[str, list[Path]]:
    """Return ("safetensors" | "pt", files) for ``load_format`` in auto/safetensors/pt."""
    if load_format in ("auto", "safetensors"):
        files = _indexed_or_glob(checkpoint, SAFETENSORS_INDEX, "*.safetensors")
        if files:
            return "safetensors", files
        if load_format == "safetensors":
            raise ValueError(f"load.format=safetensors: no *.safetensors files in {checkpoint}")
    files = _indexed_or_glob(checkpoint, PT_INDEX, "*.bin") or sorted(checkpoint.glob("*.pt"))
    if not files:
        raise ValueError(
            f"model.path={str(checkpoint)!r}: no weight files (*.safetensors, *.bin, *.pt); "
            f"add them or run on random weights with load.format=dummy"
        )
    return "pt", files


def _indexed_or_glob(checkpoint: Path, index_name: str, pattern: str) -> list[Path]:
    index = checkpoint / index_name
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [checkpoint / name for name in sorted(set(weight_map.values()))]
    return sorted(p for p in checkpoint.glob(pattern) if not p.name.startswith("training_"))


def iterate_weights(kind: str, files: list[Path]) -> Iterator[tuple[str, Any]]:
    """Yield (name, tensor or lazy safetensors slice) for every tensor of every file."""
    for path in files:
        if kind == "safetensors":
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_slice(name)
        else:
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            yield from state.items()


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".tensors", ".gguf")


def copy_model_files(checkpoint: Path, out: Path) -> None:
    """Copy everything but the weights (config.json, tokenizer files, generation config) from
    ``checkpoint`` to ``out``, so a re-serialized checkpoint is a complete model directory."""
    out.mkdir(parents=True, exist_ok=True)
    for path in checkpoint.iterdir():
        if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES) and not path.name.endswith(".index.json"):
            (out / path.name).write_bytes(path.read_bytes())
