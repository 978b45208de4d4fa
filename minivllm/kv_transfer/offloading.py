"""The prefix cache's host-memory tier (``cache.kv_offloading_size``, vLLM's native offloading).

Every full block a step computes is copied, after that step, into a pool of host-memory
slots (pinned on CUDA), unless its hash is there already; the slots are reused least
recently used first, so the pool holds the most recently computed or hit prefixes.
When a block leaves the device cache (evicted for new tokens, or its request preempted),
its copy stays, and a later request whose prefix reaches past the device's hits loads
the next blocks from the pool instead of computing them::

    request's blocks:   [ a | b | c | d | e ]          last token always computed
    device hits:          a   b                        (prefix cache, no copy)
    host hits:                    c   d                (loaded before the forward)
    computed:                             e

Under tensor parallelism every rank keeps its own shard of each block in its own pool
(the size is split evenly between the ranks); the scheduler half decides for all.

On CUDA the copies run on a stream of their own: a step's loads go first and the
forward waits for them; its saves are queued after the forward and overlap the
sampling and the host's work on the next step, which waits for them before it runs
(a saved block may be reallocated to the next step). On the CPU they are plain copies.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Literal

import torch

from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.kv_transfer.connector import KVConnector, KVConnectorMetadata
from minivllm.request import BlockHash

if TYPE_CHECKING:
    from minivllm.config.vllm_config import VllmConfig

GiB = 1 << 30


def num_host_blocks(size_gib: float, tp: int, kv_bytes_per_block: int) -> int:
    """Slots in each rank's pool: its share of ``size_gib`` over the bytes of its shard of a block."""
    if kv_bytes_per_block <= 0:
        raise ValueError("cache.kv_offloading_size: the workers reported no KV bytes per block")
    return int(size_gib * GiB / tp // kv_bytes_per_block)


class OffloadingConnector(KVConnector):
    """Host-memory slots by block hash; keys are slot indices (the same on every rank)."""

    def __init__(self, cfg: VllmConfig, role: Literal["scheduler", "worker"], kv_spec: KVCacheSpec) -> None:
        super().__init__(cfg, role, kv_spec)
        self.num_slots = num_host_blocks(cfg.cache.kv_offloading_size, cfg.parallel.tp, self.kv_bytes_per_block)
        if self.num_slots < 1:
            raise ValueError(
                f"cache.kv_offloading_size={cfg.cache.kv_offloading_size}: holds no block of "
                f"{self.kv_bytes_per_block * cfg.parallel.tp} bytes; raise it"
            )
        if role == "scheduler":
            self.slots: OrderedDict[BlockHash, int] = OrderedDict()
            """Hash -> slot holding its KV, least recently used first."""
            self._free_slots = list(range(self.num_slots - 1, -1, -1))
        else:
            self.pool: torch.Tensor | None = None
            """(num_slots, kv_bytes_per_block) uint8 host memory; allocated with the KV cache."""
            self.stream: torch.cuda.Stream | None = None

    # ---- scheduler half ---------------------------------------------------------------
    def lookup(self, block_hash: BlockHash) -> int | None:
        slot = self.slots.get(block_hash)
        if slot is not None:
            self.slots.move_to_end(block_hash)
        return slot

    def reset_cache(self) -> None:
        self.slots.clear()
        self._free_slots = list(range(self.num_slots - 1, -1, -1))

    def reserve(self, block_hash: BlockHash) -> int | None:
        if block_hash in self.slots:
            self.slots.move_to_end(block_hash)
            return None
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            _, slot = self.slots.popitem(last=False)  # the least recently used copy is overwritten
        self.slots[block_hash] = slot
        return slot

    # ---- worker half ------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: list[torch.Tensor], block_dim: int) -> None:
        super().register_kv_caches(kv_caches, block_dim)
        if self.pool is None:
            cuda = kv_caches[0].device.type == "cuda"
            self.pool = torch.empty((self.num_slots, self.kv_bytes_per_block), dtype=torch.uint8, pin_memory=cuda)
            self.stream = torch.cuda.Stream(kv_caches[0].device) if cuda else None

    def read(self, keys: list[int]) -> torch.Tensor:
        return self.pool[torch.tensor(keys)]

    def write(self, keys: list[int], data: torch.Tensor) -> None:
        self.pool[torch.tensor(keys)] = data

    def start_load_kv(self, meta: KVConnectorMetadata) -> None:
        if self.stream is None:
            return super().start_load_kv(meta)
        transfers = [t for ts in meta.loads.values() for t in ts]
        if not transfers:
            return
        compute = torch.cuda.current_stream()
        self.stream.wait_stream(compute)  # the blocks may have been read by the step before
        with torch.cuda.stream(self.stream):
            rows = torch.empty((len(transfers), self.kv_bytes_per_block), dtype=torch.uint8, device=compute.device)
            for row, (_, slot) in enumerate(transfers):
                rows[row].copy_(self.pool[slot], non_blocking=True)  # (bytes,) pinned -> device
            self.scatter([b for b, _ in transfers], rows)
        compute.wait_stream(self.stream)  # the forward reads them

    def save_kv(self, meta: KVConnectorMetadata) -> None:
        if self.stream is None:
            return super().save_kv(meta)
        transfers = [t for ts in meta.saves.values() for t in ts]
        if not transfers:
            return
        compute = torch.cuda.current_stream()
        self.stream.wait_stream(compute)  # after the forward that computed them
        with torch.cuda.stream(self.stream):
            rows = self.gather([b for b, _ in transfers])  # (n, bytes) on the device
            for row, (_, slot) in enumerate(transfers):
                self.pool[slot].copy_(rows[row], non_blocking=True)
        compute.wait_stream(self.stream)  # later kernels may overwrite the blocks
