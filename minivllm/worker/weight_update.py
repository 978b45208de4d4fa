"""New weights into a running engine, without a restart: the worker half of RL weight sync.

``WeightUpdateExtension`` is a worker extension (``parallel.worker_extension_cls``,
see ``worker/extension.py``): its methods run on every rank through
``LLM.collective_rpc``. Two ways in, as RL frameworks use them:

* by path: ``update_weights_from_path(dir_or_file)`` reads a safetensors (or
  torch) checkpoint the trainer saved;
* over a process group: the trainer and the workers join a ``StatelessGroup``
  (``init_weight_update_group``), then for each tensor the trainer calls
  ``update_weight(name, dtype, shape)`` on the engine *and* broadcasts the tensor
  from its rank 0; every worker receives it and loads it.

Either way the tensors carry checkpoint (Hugging Face) names and full shapes:
``model.load_weights`` does what it does at start-up (q/k/v into the fused qkv
parameter, gate/up into gate_up, the rank's tensor-parallel slice), copying into
the existing parameters, so their addresses (and captured CUDA graphs) stay valid.
A partial update (one tensor at a time) is the usual case here, so parameters
that receive nothing keep their values.

KV blocks computed with the old weights stay in the prefix cache until the caller
drops them with ``LLM.reset_prefix_cache()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import torch
from torch import nn

from minivllm.distributed.stateless_group import StatelessGroup
from minivllm.model_loader.weight_files import find_weight_files, iterate_weights
from minivllm.models.utils import MissingWeightsError

DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16)}
"""Dtypes a broadcast tensor may have, by name (``"bfloat16"``) or as a torch dtype."""


@torch.no_grad()
def load_weights_in_place(model: nn.Module, weights: Iterable[tuple[str, Any]], quantized: bool = False) -> int:
    """Load checkpoint-named tensors into ``model``'s existing parameters; returns how many were given.

    Quantized models are refused: their loaded tensors are repacked after loading
    (``process_weights_after_loading``) and cannot be overwritten piecemeal.
    """
    if quantized:
        raise ValueError(
            "weight update: not supported for quantized models (model.quantization is set); "
            "serve an unquantized checkpoint for in-place updates"
        )
    counted: list[str] = []

    def count(items: Iterable[tuple[str, Any]]):
        for name, tensor in items:
            counted.append(name)
            yield name, tensor

    try:
        model.load_weights(count(weights))
    except MissingWeightsError:
        pass  # raised after every given tensor was loaded: the rest keep their values
    return len(counted)


def checkpoint_weights(path: str | Path) -> Iterable[tuple[str, Any]]:
    """(name, tensor) of a checkpoint directory (safetensors preferred, else .bin/.pt) or one file."""
    path = Path(path)
    if path.is_file():
        kind = "safetensors" if path.suffix == ".safetensors" else "pt"
        return iterate_weights(kind, [path])
    if not path.is_dir():
        raise ValueError(f"update_weights_from_path: path={str(path)!r} is neither a directory nor a file")
    kind, files = find_weight_files(path, "auto")
    return iterate_weights(kind, files)


def as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"update_weight: dtype={dtype!r} must be one of {', '.join(DTYPES)}")
    return DTYPES[name]


class WeightUpdateExtension:
    """Mixed into every worker (``LLM(worker_extension_cls="minivllm.worker.weight_update.WeightUpdateExtension")``).

    ``self`` is the Worker: ``self.model_runner.model`` is the live model, ``self.rank``
    its rank, ``self.device`` its device.
    """

    def update_weights_from_path(self, path: str) -> int:
        """Load every tensor of the checkpoint at ``path``; returns how many."""
        self._check_weights_awake("update_weights_from_path")
        model = self.model_runner.model
        return load_weights_in_place(model, checkpoint_weights(path), self.cfg.quant_spec is not None)

    def init_weight_update_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int
    ) -> None:
        """Join the trainer's group as member ``rank_offset + self.rank`` (the trainer is member 0)."""
        if getattr(self, "weight_update_group", None) is not None:
            raise ValueError("init_weight_update_group: this worker is already in a weight-update group")
        self.weight_update_group = StatelessGroup.create(
            master_address, master_port, rank_offset + self.rank, world_size, self.device
        )

    def update_weight(self, name: str, dtype: str | torch.dtype, shape: tuple[int, ...] | list[int]) -> None:
        """Receive one full (unsharded) tensor broadcast by the trainer (member 0) and load it as ``name``."""
        dtype = as_dtype(dtype)
        group = getattr(self, "weight_update_group", None)
        if group is None:
            raise ValueError("update_weight: call init_weight_update_group first")
        tensor = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        group.broadcast(tensor, src=0)  # received even when refused below: the trainer's broadcast must complete
        self._check_weights_awake("update_weight")
        load_weights_in_place(self.model_runner.model, [(name, tensor)], self.cfg.quant_spec is not None)

    def _check_weights_awake(self, method: str) -> None:
        if "weights" in self.sleep_state.asleep:
            raise ValueError(f"{method}: the weights are asleep; call wake_up(tags=['weights']) first")

    def close_weight_update_group(self) -> None:
        """Leave the group; the trainer calls ``StatelessGroup.close`` at the same time."""
        group = getattr(self, "weight_update_group", None)
        if group is not None:
            group.close()
            self.weight_update_group = None

    def weights_checksum(self) -> float:
        """The sum of every parameter of this rank (a cheap check that an update arrived)."""
        return float(sum(p.detach().double().sum() for p in self.model_runner.model.parameters()))
