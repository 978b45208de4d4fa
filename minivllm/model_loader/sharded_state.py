"""``load.format=sharded_state``: each tensor-parallel rank saves and loads its own shard.

A sharded-state checkpoint is the engine's own parameters (fused q/k/v,
gate/up, already split over ranks) as each rank holds them, one set of
safetensors files per rank, named as vLLM names them::

    model-rank-0-part-0.safetensors   model-rank-1-part-0.safetensors   ...

plus the original's config and tokenizer files. Loading copies each rank's
files straight into its parameters: no rank reads another's bytes, and no
tensor is sliced or re-fused, so it must be loaded at the tensor-parallel size
it was saved at. Save one from a running engine with ``save_sharded_state`` or::

    python tools/save_sharded_state.py path/to/hf_checkpoint path/to/out_dir --tp 2
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from minivllm.attention.backend import AttentionBackend
from minivllm.attention.kv_quant import load_kv_scale
from minivllm.config.vllm_config import VllmConfig
from minivllm.distributed.parallel_state import tp_rank, tp_size
from minivllm.model_loader.loader import build_empty_model
from minivllm.model_loader.weight_files import copy_model_files

FILE_PATTERN = "model-rank-{rank}-part-{part}.safetensors"
_FILE_RE = re.compile(r"model-rank-(\d+)-part-(\d+)\.safetensors")
MAX_PART_BYTES = 5 * 2**30


def save_sharded_state(llm: Any, out: str | Path, max_part_bytes: int = MAX_PART_BYTES) -> list[list[str]]:
    """Have every rank of ``llm`` (an ``LLM``) write its parameters to ``out``; copy the
    checkpoint's other files there too. Returns each rank's file names. Data-parallel
    replicas hold the same shards: the first replica's ranks write them."""
    out = Path(out)
    if llm.cfg.checkpoint_dir is not None:
        copy_model_files(llm.cfg.checkpoint_dir, out)
    out.mkdir(parents=True, exist_ok=True)
    names = llm.collective_rpc(save_rank_shard, args=(str(out), max_part_bytes))
    return [rank_names for rank_names in names if rank_names]


def save_rank_shard(worker: Any, out: str, max_part_bytes: int) -> list[str]:
    """Runs in each worker: write this rank's parameters in parts of at most ``max_part_bytes``
    (nothing on a data-parallel replica past the first)."""
    if worker.cfg.parallel.dp_rank > 0:
        return []
    model = worker.model_runner.model
    parts: list[dict[str, torch.Tensor]] = [kv_scales(model)]
    size = 0
    for name, param in model.named_parameters():  # tied weights appear once
        nbytes = param.numel() * param.element_size()
        if parts[-1] and size + nbytes > max_part_bytes:
            parts.append({})
            size = 0
        parts[-1][name] = param.detach().cpu().contiguous()
        size += nbytes
    names = [FILE_PATTERN.format(rank=tp_rank(), part=i) for i in range(len(parts))]
    for name, tensors in zip(names, parts):
        save_file(tensors, str(Path(out) / name))
    return names


def kv_scales(model: nn.Module) -> dict[str, torch.Tensor]:
    """The attention layers' fp8 KV-cache scales that differ from 1.0, under vLLM's checkpoint names."""
    scales = {}
    for path, module in model.named_modules():
        for kind in ("k_scale", "v_scale"):
            value = getattr(module, kind, 1.0) if hasattr(module, "kv_cache") else 1.0
            if value != 1.0:
                scales[f"{path.rpartition('.')[0]}.{kind}"] = torch.tensor(value, dtype=torch.float32)
    return scales


def rank_files(checkpoint: Path, rank: int, world: int) -> list[Path]:
    """This rank's files; raises unless the directory was saved at ``world`` ranks."""
    found: dict[int, list[Path]] = {}
    for path in checkpoint.glob("model-rank-*-part-*.safetensors"):
        match = _FILE_RE.fullmatch(path.name)
        if match:
            found.setdefault(int(match.group(1)), []).append(path)
    if not found:
        raise ValueError(
            f"load.format=sharded_state: no model-rank-*-part-*.safetensors in {checkpoint}; save them with "
            f"python tools/save_sharded_state.py <checkpoint> <out_dir> --tp <size>"
        )
    if sorted(found) != list(range(world)):
        raise ValueError(
            f"load.format=sharded_state: {checkpoint} holds shards of ranks {sorted(found)}; "
            f"load it with parallel.tp={max(found) + 1} (the size it was saved at), not {world}"
        )
    return sorted(found[rank], key=lambda p: int(_FILE_RE.fullmatch(p.name).group(2)))


class ShardedStateLoader:
    """Builds the model as the default loader does, then fills each parameter from this rank's files."""

    def load_model(self, cfg: VllmConfig, backend: AttentionBackend, device: torch.device) -> nn.Module:
        model = build_empty_model(cfg, backend, device)
        params = dict(model.named_parameters())
        missing = set(params)
        for path in rank_files(cfg.checkpoint_dir, tp_rank(), tp_size()):
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                for name in f.keys():
                    if load_kv_scale(model, name, f.get_tensor(name)):
                        continue
                    if name not in params:
                        raise ValueError(f"{path.name}: tensor {name!r} matches no parameter of {type(model).__name__}")
                    value = f.get_tensor(name)
                    if value.shape != params[name].shape:
                        raise ValueError(
                            f"{path.name}: {name!r} has shape {tuple(value.shape)}, "
                            f"the parameter {tuple(params[name].shape)}"
                        )
                    params[name].data.copy_(value)
                    missing.discard(name)
        if missing:
            raise ValueError(f"load.format=sharded_state: no tensors for {', '.join(sorted(missing)[:8])}")
        return model.eval()
