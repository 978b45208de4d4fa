"""One step's flat inputs, computed with numpy from the persistent batch and sent
to the device in a single copy.

Every integer array a step needs is written into one int32 staging buffer
(pinned host memory on CUDA) and copied to the device at once::

    staging: [ input_ids T | positions T | slots T | query_start B+1 | seq_lens B | block_tables B*W
               | logits_idx S | placeholder dst P | placeholder src P ]

On CUDA two staging buffers alternate, and a buffer is written again only after
its last copy finished (an event), so preparing step k+1 never overwrites what
step k is still copying. On the CPU the "device" tensors are views of the
staging buffer itself: no copy at all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from minivllm.attention.backend import AttentionMetadata
from minivllm.worker.input_batch import InputBatch

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    """(T,) int64 on the device."""
    positions: torch.Tensor
    """(T,) int64 on the device."""
    meta: AttentionMetadata
    rows: np.ndarray
    """(B,) the batch rows scheduled this step, in step order."""
    query_lens: np.ndarray
    """(B,) new tokens per scheduled row."""
    sample_idx: np.ndarray
    """(S,) indices into ``rows`` of the requests that sample this step (all their known tokens computed)."""
    logits_index: torch.Tensor
    """(S,) int64 on the device: the flat-batch row of each sampling request's last token."""
    token_positions: np.ndarray
    """(T,) host copy of the positions (prompt logprobs and the async patch read it)."""
    token_rows: np.ndarray
    """(T,) batch row of each token."""
    query_start: np.ndarray
    """(B + 1,) host copy of ``meta.query_start_loc``."""
    placeholders: tuple[torch.Tensor, torch.Tensor] | None = None
    """Async scheduling: (flat-batch indices, indices into the previous step's sampled
    tokens) of input tokens this runner has not received yet; None when there are none."""


class StepInputBuilder:
    def __init__(self, max_num_tokens: int, max_num_reqs: int, max_blocks_per_req: int, block_size: int,
                 device: torch.device) -> None:
        self.device = device
        self.block_size = block_size
        size = 3 * max_num_tokens + 5 * max_num_reqs + 1 + max_num_reqs * max_blocks_per_req
        cuda = device.type == "cuda"
        self._staging = [torch.zeros(size, dtype=torch.int32, pin_memory=cuda) for _ in range(2 if cuda else 1)]
        self._copied = [torch.cuda.Event() if cuda else None for _ in self._staging]
        self._turn = 0

    def build(
        self,
        batch: InputBatch,
        rows: np.ndarray,
        query_lens: np.ndarray,
        pending_index: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> StepInputs:
        """``rows``: (B,) batch rows scheduled this step; ``query_lens``: (B,) their new-token counts.

        ``pending_index`` (async scheduling) maps batch rows to their index in the
        previous step's sampled tokens, for input tokens past a row's known ones."""
        B = len(rows)
        start = batch.num_computed_tokens[rows]  # (B,)
        seq_lens = start + query_lens
        positions, token_rows, query_start = self._token_layout(rows, query_lens, start)
        T = len(positions)
        num_blocks = batch.block_table.num_blocks[rows]
        width = int(num_blocks.max())
        blocks = batch.block_table.table[token_rows, positions // self.block_size]
        sample_idx = np.flatnonzero(seq_lens >= batch.num_tokens[rows])
        unknown = _EMPTY
        if pending_index is not None:
            unknown = np.flatnonzero(positions >= batch.num_tokens[token_rows])

        staging, parts = self._next_staging(), {}
        at = 0
        for name, n in (("ids", T), ("pos", T), ("slots", T), ("qsl", B + 1), ("seq", B),
                        ("tables", B * width), ("logits", len(sample_idx)),
                        ("ph_dst", len(unknown)), ("ph_src", len(unknown))):
            parts[name] = (at, at + n)
            at += n
        host = staging.numpy()
        host[slice(*parts["ids"])] = batch.token_ids[token_rows, positions]
        host[slice(*parts["pos"])] = positions
        host[slice(*parts["slots"])] = blocks * self.block_size + positions % self.block_size
        host[slice(*parts["qsl"])] = query_start
        host[slice(*parts["seq"])] = seq_lens
        tables = batch.block_table.table[rows, :width]  # (B, width)
        host[slice(*parts["tables"])].reshape(B, width)[:] = tables
        host[slice(*parts["logits"])] = query_start[1:][sample_idx] - 1
        if len(unknown):
            host[slice(*parts["ph_dst"])] = unknown
            host[slice(*parts["ph_src"])] = pending_index(token_rows[unknown])
        dev = self._to_device(staging[:at])
        view = lambda name: dev[slice(*parts[name])]  # noqa: E731
        meta = AttentionMetadata(
            slot_mapping=view("slots").long(),
            query_start_loc=view("qsl"),
            seq_lens=view("seq"),
            block_tables=view("tables").view(B, width),
            max_query_len=int(query_lens.max()),
            max_seq_len=int(seq_lens.max()),
            query_lens_cpu=query_lens.tolist(),
            seq_lens_cpu=seq_lens.tolist(),
            query_start_loc_cpu=query_start,
            block_tables_cpu=tables,
            has_padding=False,
        )
        return StepInputs(
            input_ids=view("ids").long(),
            positions=view("pos").long(),
            meta=meta,
            rows=rows,
            query_lens=query_lens,
            sample_idx=sample_idx,
            logits_index=view("logits").long(),
            token_positions=positions,
            token_rows=token_rows,
            query_start=query_start,
            placeholders=(view("ph_dst").long(), view("ph_src").long()) if len(unknown) else None,
        )

    @staticmethod
    def _token_layout(
        rows: np.ndarray, query_lens: np.ndarray, start: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(T,) position and batch row of each new token, and the (B + 1,) query starts."""
        B = len(rows)
        if int(query_lens.sum()) == B:  # a decode step: token i is row i's next position
            return start, rows, np.arange(B + 1, dtype=np.int32)
        query_start = np.zeros(B + 1, dtype=np.int32)
        np.cumsum(query_lens, out=query_start[1:])
        req_of_token = np.repeat(np.arange(B), query_lens)  # (T,)
        offsets = np.arange(int(query_start[-1]), dtype=np.int32) - query_start[req_of_token]  # within the query
        return start[req_of_token] + offsets, rows[req_of_token], query_start

    def _next_staging(self) -> torch.Tensor:
        self._turn = (self._turn + 1) % len(self._staging)
        event = self._copied[self._turn]
        if event is not None:
            event.synchronize()  # the copy that last read this buffer is done
        return self._staging[self._turn]

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return host
        dev = host.to(self.device, non_blocking=True)
        self._copied[self._turn].record()
        return dev
