"""Tensor- and pipeline-parallel ranks, sizes and collectives.

torch.distributed's process groups are the one piece of process-wide state the
layers read: a rank is a property of the process, not of a layer. Global
ranks are laid out stage-major::

    rank = stage * tp + tp_rank          tp=2, pp=2:   stage 0: ranks 0 1 | stage 1: ranks 2 3

With pp=1 the tensor-parallel group is the default group. With pp>1,
``init_model_parallel`` makes one group per stage (the tp ranks of that stage)
and records this rank's stage and the layer partition, which the models read
when they are built. With no process group (one rank) every collective is the
identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class PipelineLayout:
    """This process's place in the pipeline."""

    stage: int = 0
    num_stages: int = 1
    tp: int = 1
    layer_partition: tuple[int, ...] | None = None
    """Decoder layers per stage; None splits them evenly."""


_tp_group: dist.ProcessGroup | None = None
"""This stage's tensor-parallel group when pp > 1 (None: the default group)."""
_layout = PipelineLayout()


def init_model_parallel(tp: int, pp: int, layer_partition: list[int] | None = None) -> None:
    """After ``dist.init_process_group``: the per-stage tp groups (every rank creates every group)."""
    global _tp_group, _layout
    if pp == 1:
        return
    rank = dist.get_rank()
    for stage in range(pp):
        group = dist.new_group(list(range(stage * tp, (stage + 1) * tp)))
        if rank // tp == stage:
            _tp_group = group
    _layout = PipelineLayout(rank // tp, pp, tp, tuple(layer_partition) if layer_partition else None)


def destroy_model_parallel() -> None:
    global _tp_group, _layout
    _tp_group, _layout = None, PipelineLayout()


def pipeline_layout() -> PipelineLayout:
    return _layout


def tp_size() -> int:
    return dist.get_world_size(_tp_group) if dist.is_available() and dist.is_initialized() else 1


def tp_rank() -> int:
    return dist.get_rank(_tp_group) if dist.is_available() and dist.is_initialized() else 0


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the tensor-parallel ranks, in place."""
    if tp_size() > 1:
        dist.all_reduce(x, group=_tp_group)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate each rank's ``x`` along the last dimension, rank order."""
    world = tp_size()
    if world == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=_tp_group)
    return torch.cat(parts, dim=-1)


def broadcast_from_first(x: torch.Tensor) -> torch.Tensor:
    """Give every tensor-parallel rank its group's rank 0's ``x``, in place."""
    if tp_size() > 1:
        src = 0 if _tp_group is None else dist.get_global_rank(_tp_group, 0)
        dist.broadcast(x, src=src, group=_tp_group)
    return x
