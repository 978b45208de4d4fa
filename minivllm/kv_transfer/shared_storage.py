"""Disaggregated prefill through a shared directory (vLLM's ``ExampleConnector``).

A producer engine (``kv_role: kv_producer``, or ``kv_both``) writes each full block
it computes to ``kv_connector_extra_config.shared_storage_path`` as one file per
tensor-parallel rank, named by the block's hash; a consumer engine (``kv_consumer``
or ``kv_both``) admitting a request loads the blocks after its own prefix-cache hits
whose files are all there, and computes the rest: a miss is computed locally, never
an error. Run the prefill engine with ``max_tokens=1`` and the decode engine on the
same prompt: its first step loads the prompt's KV and computes one token::

    <path>/<sha256 hex of the block>.tp<size>r<rank>.kv     raw bytes: every layer's
                                                              keys and values of the block

The hash covers the model, the dtypes, the adapter and the whole prefix
(``core/block_hash.py``), and the file name the tensor-parallel layout, so a file
found holds KV that is right for the request. A file is written under a temporary
name and renamed into place, so a reader sees a whole file or none, and two
producers that write the same block leave one of the two identical copies.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from minivllm.distributed.parallel_state import tp_rank
from minivllm.kv_cache_spec import KVCacheSpec
from minivllm.kv_transfer.connector import KVConnector
from minivllm.request import BlockHash

if TYPE_CHECKING:
    from minivllm.config.vllm_config import VllmConfig


class SharedStorageConnector(KVConnector):
    """Blocks as files in a shared directory; keys are hashes' hex strings."""

    def __init__(self, cfg: VllmConfig, role: Literal["scheduler", "worker"], kv_spec: KVCacheSpec) -> None:
        super().__init__(cfg, role, kv_spec)
        extra = cfg.kv_transfer.kv_connector_extra_config
        path = extra.get("shared_storage_path")
        unknown = sorted(set(extra) - {"shared_storage_path"})
        if unknown:
            raise ValueError(
                f"kv_transfer.kv_connector_extra_config: unknown key(s) {', '.join(unknown)} for "
                f"{cfg.kv_transfer.kv_connector}; known: shared_storage_path"
            )
        if not path:
            raise ValueError(
                f"kv_transfer.kv_connector={cfg.kv_transfer.kv_connector}: needs "
                "kv_transfer.kv_connector_extra_config.shared_storage_path (a directory)"
            )
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.tp = cfg.parallel.tp

    def _file(self, key: str, rank: int) -> Path:
        return self.path / f"{key}.tp{self.tp}r{rank}.kv"

    # ---- scheduler half ---------------------------------------------------------------
    def lookup(self, block_hash: BlockHash) -> str | None:
        key = block_hash.hex()
        return key if all(self._file(key, r).is_file() for r in range(self.tp)) else None

    def reserve(self, block_hash: BlockHash) -> str | None:
        return None if self.lookup(block_hash) is not None else block_hash.hex()

    # ---- worker half ------------------------------------------------------------------
    def read(self, keys: list[str]) -> torch.Tensor:
        rank, width = tp_rank(), self.kv_bytes_per_block
        rows = np.empty((len(keys), width), dtype=np.uint8)
        for row, key in enumerate(keys):
            data = np.fromfile(self._file(key, rank), dtype=np.uint8)
            if data.size != width:
                raise RuntimeError(f"{self._file(key, rank)}: {data.size} bytes, a block here is {width}")
            rows[row] = data
        return torch.from_numpy(rows)

    def write(self, keys: list[str], data: torch.Tensor) -> None:
        rank, rows = tp_rank(), data.cpu().numpy()
        for key, row in zip(keys, rows):
            target = self._file(key, rank)
            if target.exists():
                continue  # another producer wrote the same block
            fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(row.tobytes())
            os.replace(tmp, target)  # atomic: readers see the whole file or none
