"""The KV-connector seam: what a connector decides beside the scheduler and does in each worker.

A connector keeps KV blocks somewhere outside the device's paged cache (host memory,
a shared directory, another engine), keyed by the prefix cache's block hashes
(``core/block_hash.py``: a hash names a whole prefix, the model and the adapter, so a
key found is KV that is right for this request). Per step::

    scheduler half                                   worker half (every rank)
    admission: get_num_new_matched_tokens  ─┐
      (blocks after the device's own hits)  │
    update_state_after_alloc (their blocks) │
    build_connector_meta ── SchedulerOutput.kv_connector_metadata ──>  start_load_kv   (before the forward;
                                                                          the forward waits for it)
                                                                      forward
                                                                      save_kv         (blocks this step computed)
    update_connector_output <── ModelRunnerOutput.kv_connector_output ── get_finished
    request_finished (its state dropped)

Loads fill blocks freshly allocated to the request (the tokens they hold count as
computed, never scheduled); saves copy full blocks whose KV this step computes.

A load can fail after the scheduler committed to it (a file removed or cut short, a
producer engine gone mid-transfer): the worker keeps each request's blocks up to the
first that failed, reports the failed one and every later one of that request as
``invalid_block_ids`` (the union over the tensor-parallel ranks), and the step runs on.
The scheduler then drops what that step sampled for the request, takes the invalid
blocks out of the prefix cache and preempts it: readmitted, it finds its good blocks
in the device's cache, loads nothing more through the connector, and computes the
rest (``Scheduler._recover_failed_loads``). Nothing is lost but the time.
The worker runs a step's loads before its forward and its saves after it, and steps
in order, so a key reused by a later save is never read stale, and a block freed
and reallocated is never saved after it is overwritten. A connector that is off is
None: the scheduler and runner check that once per step.

Subclasses say how keys are found and where bytes go: ``lookup`` / ``reserve``
beside the scheduler, ``read`` / ``write`` in the workers; the worker half moves a
block's bytes over every layer as one row (``gather`` / ``scatter``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal

import torch

from minivllm.distributed.parallel_state import all_reduce
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.outputs import KVConnectorOutput
from minivllm.request import BlockHash, Request, RequestId

if TYPE_CHECKING:
    from minivllm.config.vllm_config import VllmConfig

logger = logging.getLogger(__name__)

BlockTransfer = tuple[int, Any]
"""(device block id, the connector's key for that block's KV)."""


@dataclass
class KVConnectorMetadata:
    """One step's transfers, per request, from the scheduler half to every worker."""

    loads: dict[RequestId, list[BlockTransfer]] = field(default_factory=dict)
    """Blocks to fill before the forward."""
    saves: dict[RequestId, list[BlockTransfer]] = field(default_factory=dict)
    """Blocks to copy out after the forward (their KV is computed in this step)."""


class KVConnector:
    """One half of a connector (``role``), built once per engine (scheduler) or per rank (worker)."""

    def __init__(self, cfg: VllmConfig, role: Literal["scheduler", "worker"], kv_spec: KVCacheSpec) -> None:
        self.cfg = cfg
        self.role = role
        self.block_size = kv_spec.block_size
        self.kv_bytes_per_block = kv_spec.block_bytes
        """Bytes of one block over this rank's attention layers: the row a key holds."""
        kvt = cfg.kv_transfer
        self.loads_kv = kvt.is_consumer
        self.saves_kv = kvt.is_producer
        # scheduler half
        self._loads: dict[RequestId, list[BlockTransfer]] = {}
        """Loads decided at admission in the step being built."""
        self._num_saved: dict[RequestId, int] = {}
        """Leading blocks of each running request that are held outside already (or need not be)."""
        self.num_queried_tokens = 0
        """Prompt tokens looked up past the device's hits since the start (a consumer's)."""
        self.num_loaded_tokens = 0
        """Of those, tokens whose KV came through the connector."""
        self._failed: set[RequestId] = set()
        """Requests whose load failed: they load nothing more through the connector."""
        self.tp = cfg.parallel.tp
        # worker half
        self._layers: list[torch.Tensor] = []
        """Each layer's KV cache as bytes, (..., num_blocks at ``_block_dim``, ..., bytes)."""
        self._block_dim = 0
        self._invalid: set[int] = set()
        """Blocks whose load failed in the step being run (every rank's)."""

    # ---- what subclasses say ----------------------------------------------------------
    def lookup(self, block_hash: BlockHash) -> Any | None:
        """Scheduler: the key under which this block's KV can be loaded, or None."""
        raise NotImplementedError

    def reserve(self, block_hash: BlockHash) -> Any | None:
        """Scheduler: the key to save this block's KV under, or None when it is held already."""
        raise NotImplementedError

    def reserve_block(self, request: Request, index: int) -> Any | None:
        """Scheduler: the key to save the request's block ``index`` under (by default its hash's)."""
        return self.reserve(request.block_hashes[index])

    def read(self, keys: list[Any]) -> torch.Tensor:
        """Worker: the blocks' bytes under ``keys``, (n, kv_bytes_per_block) uint8."""
        raise NotImplementedError

    def write(self, keys: list[Any], data: torch.Tensor) -> None:
        """Worker: keep ``data`` (n, kv_bytes_per_block) uint8 on this rank's device under ``keys``."""
        raise NotImplementedError

    # ---- scheduler half ---------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        """Tokens after the first ``num_computed_tokens`` (the device's own hits, a multiple of
        the block size) that can be loaded: whole blocks, never the last token (its logits
        are computed), nothing for a request that asks for prompt logprobs."""
        if not self.loads_kv or request.sampling_params.prompt_logprobs is not None:
            return 0
        if request.request_id in self._failed:
            return 0
        hashes, bs = request.block_hashes, self.block_size
        end = min(len(hashes), (request.num_tokens - 1) // bs)
        num_blocks = 0
        for i in range(num_computed_tokens // bs, end):
            if self.lookup(hashes[i]) is None:
                break
            num_blocks += 1
        return num_blocks * bs

    def update_state_after_alloc(
        self, request: Request, block_ids: list[int], num_computed_tokens: int, num_external_tokens: int
    ) -> None:
        """The request was admitted with ``num_external_tokens`` to load after its
        ``num_computed_tokens`` device hits, into ``block_ids`` (its whole table)."""
        start, n = num_computed_tokens // self.block_size, num_external_tokens // self.block_size
        if self.loads_kv:
            self.num_queried_tokens += request.num_tokens - num_computed_tokens
        if n:
            hashes = request.block_hashes
            self._loads[request.request_id] = [(block_ids[i], self.lookup(hashes[i])) for i in range(start, start + n)]
            self.num_loaded_tokens += num_external_tokens
        self._num_saved[request.request_id] = start + n

    def build_connector_meta(
        self,
        requests: Iterable[Request],
        num_scheduled: dict[RequestId, int],
        block_ids: Callable[[RequestId], list[int]],
    ) -> KVConnectorMetadata | None:
        """The step's transfers: the loads decided at admission, and a save for each full
        block that the step computes (known tokens only). Read before the scheduler
        advances the requests. None when there is nothing to move."""
        meta = KVConnectorMetadata(loads=self._loads)
        self._loads = {}
        if self.saves_kv:
            bs, num_saved = self.block_size, self._num_saved
            for request in requests:
                req_id = request.request_id
                end = request.num_computed_tokens + num_scheduled[req_id]
                num_full = min(min(end, request.num_tokens) // bs, len(request.block_hashes))
                start = num_saved.get(req_id, 0)
                if num_full <= start:
                    continue
                num_saved[req_id] = num_full
                table, saves = block_ids(req_id), []
                for i in range(start, num_full):
                    key = self.reserve_block(request, i)
                    if key is not None:
                        saves.append((table[i], key))
                if saves:
                    meta.saves[req_id] = saves
        return meta if meta.loads or meta.saves else None

    def load_failed(self, request: Request, num_tokens: int) -> None:
        """``num_tokens`` of the request, committed to load, did not: it loads nothing more."""
        self._failed.add(request.request_id)
        self.num_loaded_tokens -= num_tokens

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        """The workers' report of a step's finished transfers (nothing to do for in-step copies)."""

    def reset_cache(self) -> None:
        """Forget every block held outside that this engine alone owns (``reset_prefix_cache``:
        after a weight update they would be stale). Shared storage keeps its files."""

    def request_finished(self, request: Request) -> dict[str, Any] | None:
        """The request left (finished or aborted): its state goes. Returns its
        ``kv_transfer_params`` for another engine, when this connector holds its KV for one."""
        self._num_saved.pop(request.request_id, None)
        self._loads.pop(request.request_id, None)
        self._failed.discard(request.request_id)
        return None

    # ---- worker half ------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: list[torch.Tensor], block_dim: int) -> None:
        """Bind the rank's KV cache (one tensor per attention layer, blocks along ``block_dim``);
        again after sleep mode gave it back."""
        self._layers = [c.view(torch.uint8) for c in kv_caches]  # the last dim in bytes
        self._block_dim = block_dim
        row = sum(c.select(block_dim, 0).numel() for c in self._layers)
        if row != self.kv_bytes_per_block:
            raise RuntimeError(f"KV connector: a block is {row} bytes here, {self.kv_bytes_per_block} planned")

    def release_kv_caches(self) -> None:
        """Drop the views of the KV cache (sleep mode gives its memory back)."""
        self._layers = []

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        """(n, kv_bytes_per_block) uint8 on the device: the blocks' bytes, layer after layer."""
        idx = torch.tensor(block_ids, device=self._layers[0].device)
        dim, n = self._block_dim, len(block_ids)
        return torch.cat([c.index_select(dim, idx).movedim(dim, 0).reshape(n, -1) for c in self._layers], dim=1)

    def scatter(self, block_ids: list[int], data: torch.Tensor) -> None:
        """Write ``data`` (n, kv_bytes_per_block) uint8 on the device into the blocks."""
        idx = torch.tensor(block_ids, device=self._layers[0].device)
        dim, offset = self._block_dim, 0
        for c in self._layers:
            shape = list(c.shape)
            shape[dim] = len(block_ids)
            width = c.numel() // c.shape[dim]
            rows = data[:, offset : offset + width].reshape(len(block_ids), *(shape[:dim] + shape[dim + 1 :]))
            c.index_copy_(dim, idx, rows.movedim(0, dim))
            offset += width

    def start_load_kv(self, meta: KVConnectorMetadata) -> None:
        """Fill the step's loaded blocks; the forward that follows sees them. A request's
        blocks from the first that fails to load on any rank on are ``_invalid``."""
        self._invalid = set()
        if not meta.loads:
            return
        failed = []  # per block of the step's loads, in the metadata's order (the same on every rank)
        for req_id, transfers in meta.loads.items():
            good = self.load_blocks(req_id, transfers)
            failed.extend(i >= good for i in range(len(transfers)))
        if self.tp > 1:  # a block is good only where every rank loaded its shard
            flags = torch.tensor(failed, dtype=torch.int64, device=self._layers[0].device)
            failed = [n > 0 for n in all_reduce(flags).tolist()]  # (num loaded blocks,) ranks failed on each
        row = 0
        for transfers in meta.loads.values():
            flags, row = failed[row : row + len(transfers)], row + len(transfers)
            if any(flags):  # the first failed block and every later one
                self._invalid.update(b for b, _ in transfers[flags.index(True) :])

    def load_blocks(self, req_id: RequestId, transfers: list[BlockTransfer]) -> int:
        """Load one request's blocks in order; returns how many leading ones are in (all of
        them unless a read failed: the failure is logged, the blocks after it are skipped)."""
        device = self._layers[0].device
        try:
            self.scatter([b for b, _ in transfers], self.read([k for _, k in transfers]).to(device))
            return len(transfers)
        except (OSError, RuntimeError, ValueError) as err:
            logger.warning("KV load of request %s failed (%s): its tokens from there on are recomputed", req_id, err)
        for good, (block_id, key) in enumerate(transfers):  # the blocks before the failure are good
            try:
                self.scatter([block_id], self.read([key]).to(device))
            except (OSError, RuntimeError, ValueError):
                return good
        return len(transfers)

    def save_kv(self, meta: KVConnectorMetadata) -> None:
        """Copy out the blocks the step's forward computed."""
        transfers = [t for ts in meta.saves.values() for t in ts]
        if transfers:
            self.write([k for _, k in transfers], self.gather([b for b, _ in transfers]))

    def get_finished(self, meta: KVConnectorMetadata) -> KVConnectorOutput:
        """The requests whose transfers of this step are done (in-step copies: all of them)."""
        return KVConnectorOutput(
            finished_loading=set(meta.loads), finished_saving=set(meta.saves), invalid_block_ids=self._invalid
        )
