"""A process group of its own between a trainer and the engine's workers.

The engine's tensor-parallel group is torch.distributed's default group (set
up by ``Worker.init_device``); a trainer that sends weights must not join it,
nor create a second default group in a worker. So the weight-sync group is
built directly from a ``TCPStore`` and a backend object (``ProcessGroupGloo``
on the CPU, ``ProcessGroupNCCL`` on CUDA), never registered with
torch.distributed: the default group, and any group the trainer already has,
are left as they are::

    trainer (rank 0, hosts the store) ──┐
    worker tp rank 0 (rank 1)        ───┼── StatelessGroup: broadcast from rank 0
    worker tp rank 1 (rank 2)        ───┘

The point-to-point KV connector (``kv_transfer/p2p.py``) makes a group of two per
pair of workers and sends KV blocks with ``send`` / ``recv``.

Every member calls ``StatelessGroup.create`` with the same address, port and
world size; the call returns once all of them have joined. Every member calls
``close`` at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class StatelessGroup:
    """One member's handle on the group: its rank, the group's size, and the backend object."""

    rank: int
    world_size: int
    backend: str
    """``gloo`` (CPU tensors) or ``nccl`` (CUDA tensors)."""
    pg: dist.ProcessGroup
    store: dist.Store

    @classmethod
    def create(
        cls,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        device: torch.device | str = "cpu",
        timeout_s: float = 300.0,
    ) -> "StatelessGroup":
        """Join (rank 0: host) the group at ``host:port``; blocks until all ``world_size`` members joined."""
        if not 0 <= rank < world_size:
            raise ValueError(f"weight-sync group: rank={rank} must be in [0, world_size={world_size})")
        device = torch.device(device)
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)
        prefixed = dist.PrefixStore("minivllm-weight-sync", store)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
            backend = "nccl"
        else:
            pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
            backend = "gloo"
        return cls(rank, world_size, backend, pg, store)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """``tensor`` from member ``src`` into every member's ``tensor`` (in place); returns it."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self.pg.broadcast([tensor], opts).wait()
        return tensor

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """``tensor`` to member ``dst`` (point to point; it calls ``recv`` with a tensor of the same shape)."""
        self.pg.send([tensor], dst, 0).wait()

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Member ``src``'s ``send`` into ``tensor`` (in place); returns it."""
        self.pg.recv([tensor], src, 0).wait()
        return tensor

    def barrier(self) -> None:
        """Returns once every member has reached it (a one-element all-reduce: works on both backends)."""
        device = "cuda" if self.backend == "nccl" else "cpu"
        self.pg.allreduce([torch.zeros(1, device=device)]).wait()

    def close(self) -> None:
        """Every member calls it: waits for all of them (so nothing sent is lost in a member
        that leaves early), then releases the backend's connections."""
        self.barrier()
        shutdown = getattr(self.pg, "shutdown", None)
        if shutdown is not None:
            shutdown()
