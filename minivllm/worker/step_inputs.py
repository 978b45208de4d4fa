"""One step's flat inputs, computed with numpy from the persistent batch and sent
to the device in a single copy.

Every integer array a step needs is written into one int32 staging buffer
(pinned host memory on CUDA) and copied to the device at once::

    staging: [ input_ids T | positions T | slots T | logits_idx S | placeholder dst P | placeholder src P
               | query_start B+1 | seq_lens B | block_tables B*W | state slots B' | has initial state B' ]

(``B' = B`` for a hybrid model's step, whose linear-attention state slots travel in the same
copy; 0 otherwise.)

The first six parts are read as int64 on the device: they are converted in one
op and handed out as views of it.

On CUDA two staging buffers alternate, and a buffer is written again only after
its last copy finished (an event), so preparing step k+1 never overwrites what
step k is still copying. On the CPU the "device" tensors are views of the
staging buffer itself: no copy at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Callable, NamedTuple

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
    """(T,) int64 on the device; (3, T) for an M-RoPE model (the runner's ``MRopePositions``)."""
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

    def advance(self, tokens: torch.Tensor, block_size: int) -> None:
        """Turn a decode-only step (one token a row, every row sampling) into the next one over
        the same rows, on the device (multi-step decoding, ``SchedulerOutput.num_steps``): each
        row's sampled token ``tokens`` (B,) becomes its input one position on, its KV going to the
        slot its block table gives that position (the scheduler allocated the slots of every step).
        The host copies move along; what an attention backend derived from the step
        (``meta.backend_data``, ``meta.mla_plan``) is dropped for the caller to derive again."""
        meta = self.meta
        position = meta.seq_lens.long()  # (B,) each row's new token's position: the last step's length
        block = meta.block_tables.gather(1, (position // block_size).unsqueeze(1)).squeeze(1)  # (B,)
        meta.slot_mapping = block.long() * block_size + position % block_size
        meta.seq_lens = meta.seq_lens + 1
        meta.seq_lens_cpu = np.asarray(meta.seq_lens_cpu) + 1
        meta.max_seq_len += 1
        meta.backend_data = meta.mla_plan = None
        self.input_ids = tokens
        self.positions = self.positions + 1  # (T,), or (3, T) M-RoPE: a text token moves on all three
        self.token_positions = self.token_positions + 1


class StepInputBuilder:
    def __init__(
        self, max_num_tokens: int, max_num_reqs: int, max_blocks_per_req: int, block_size: int, device: torch.device
    ) -> None:
        self.device = device
        self.block_size = block_size
        size = 3 * max_num_tokens + 7 * max_num_reqs + 1 + max_num_reqs * max_blocks_per_req
        cuda = device.type == "cuda"
        self._staging = [torch.zeros(size, dtype=torch.int32, pin_memory=cuda) for _ in range(2 if cuda else 1)]
        self._host = [buffer.numpy() for buffer in self._staging]
        self._arange = np.arange(max_num_reqs + 1, dtype=np.int32)
        self._arange.flags.writeable = False  # handed out as a decode step's query starts
        self._copied = [torch.cuda.Event() if cuda else None for _ in self._staging]
        self._turn = 0

    def build(
        self,
        batch: InputBatch,
        rows: np.ndarray,
        query_lens: np.ndarray,
        pending_index: Callable[[np.ndarray], np.ndarray] | None = None,
        num_tokens: int | None = None,
        state_slots: np.ndarray | None = None,
    ) -> StepInputs:
        """``rows``: (B,) batch rows scheduled this step, ascending; ``query_lens``: (B,) their
        new-token counts, ``num_tokens`` their sum when the caller knows it (it must be
        exact: ``num_tokens == B`` is how a decode step is recognised).

        ``state_slots`` (hybrid models): (B,) the rows' linear-attention state slots; they and
        whether each row continues from its slot (tokens computed before this step) become
        ``meta.state_indices`` and ``meta.has_initial_state``.

        ``pending_index`` (async scheduling) maps batch rows to their index in the
        previous step's sampled tokens, for input tokens past a row's known ones."""
        B = len(rows)
        # rows 0 .. B-1 (every running request) read plain slices instead of gathers
        rows_at = slice(0, B) if rows[-1] == B - 1 else rows
        start = batch.num_computed_tokens[rows_at]  # (B,)
        if rows_at is not rows:
            start = start.copy()  # a slice is a view of the batch; the step keeps its own
        seq_lens = start + query_lens
        positions, token_rows, query_start = self._token_layout(rows, query_lens, start, num_tokens)
        T = len(positions)
        width = int(batch.block_table.num_blocks[rows_at].max())
        sample_idx = np.flatnonzero(seq_lens >= batch.num_tokens[rows_at])
        unknown = _EMPTY
        if pending_index is not None:
            unknown = np.flatnonzero(positions >= batch.num_tokens[token_rows])
        S, P = len(sample_idx), len(unknown)
        tables = batch.block_table.table[rows_at, :width]  # (B, width)
        if rows_at is not rows:
            tables = tables.copy()

        staging, host = self._next_staging()
        at = _Layout.of(T, S, P, B, width, 0 if state_slots is None else B)
        host[at.ids] = batch.token_ids[token_rows, positions]
        host[at.positions] = positions
        slots = host[at.slots]
        np.multiply(batch.block_table.table[token_rows, positions // self.block_size], self.block_size, out=slots)
        slots += positions % self.block_size
        # a decode step's query starts are 0 .. B, so its token i is row i's last
        host[at.logits] = sample_idx if T == B else query_start[1:][sample_idx] - 1
        if P:
            host[at.ph_dst] = unknown
            host[at.ph_src] = pending_index(token_rows[unknown])
        host[at.query_start] = query_start
        host[at.seq_lens] = seq_lens
        host[at.tables].reshape(B, width)[:] = tables
        if state_slots is not None:
            host[at.state_idx] = state_slots
            host[at.has_init] = start > 0  # a later chunk or a decode token

        dev = self._to_device(staging[: at.end])
        wide = dev[: at.num_wide].long()  # one conversion for every int64 part
        meta = AttentionMetadata(
            slot_mapping=wide[at.slots],
            query_start_loc=dev[at.query_start],
            seq_lens=dev[at.seq_lens],
            block_tables=dev[at.tables].view(B, width),
            max_query_len=1 if T == B else int(query_lens.max()),
            max_seq_len=int(seq_lens.max()),
            query_lens_cpu=query_lens,
            seq_lens_cpu=seq_lens,
            query_start_loc_cpu=query_start,
            block_tables_cpu=tables,
            has_padding=False,
        )
        if state_slots is not None:
            meta.state_indices, meta.has_initial_state = dev[at.state_idx], dev[at.has_init].bool()
        return StepInputs(
            input_ids=wide[at.ids],
            positions=wide[at.positions],
            meta=meta,
            rows=rows,
            query_lens=query_lens,
            sample_idx=sample_idx,
            logits_index=wide[at.logits],
            token_positions=positions,
            token_rows=token_rows,
            query_start=query_start,
            placeholders=(wide[at.ph_dst], wide[at.ph_src]) if P else None,
        )

    def _token_layout(
        self, rows: np.ndarray, query_lens: np.ndarray, start: np.ndarray, num_tokens: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(T,) position and batch row of each new token, and the (B + 1,) query starts."""
        B = len(rows)
        if num_tokens is None:
            num_tokens = int(query_lens.sum())
        if num_tokens == B:  # a decode step: token i is row i's next position
            return start, rows, self._arange[: B + 1]
        query_start = np.zeros(B + 1, dtype=np.int32)
        np.cumsum(query_lens, out=query_start[1:])
        req_of_token = np.repeat(np.arange(B), query_lens)  # (T,)
        offsets = np.arange(int(query_start[-1]), dtype=np.int32) - query_start[req_of_token]  # within the query
        return start[req_of_token] + offsets, rows[req_of_token], query_start

    def _next_staging(self) -> tuple[torch.Tensor, np.ndarray]:
        """The next staging buffer and its numpy view, once its last copy finished."""
        self._turn = (self._turn + 1) % len(self._staging)
        event = self._copied[self._turn]
        if event is not None:
            event.synchronize()  # the copy that last read this buffer is done
        return self._staging[self._turn], self._host[self._turn]

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return host
        dev = host.to(self.device, non_blocking=True)
        self._copied[self._turn].record()
        return dev


class _Layout(NamedTuple):
    """Where each part of a step's inputs lies in the staging buffer. The parts read as
    int64 on the device come first (converted in one op), the int32 ones after them::

        ids T | positions T | slots T | logits S | ph_dst P | ph_src P || query_start B+1 | seq_lens B | tables B*width
        | state_idx B' | has_init B'      (B' = B for a hybrid model's step, else 0)
    """

    ids: slice
    positions: slice
    slots: slice
    logits: slice
    ph_dst: slice
    """Placeholders (async scheduling): the input tokens to fill, and where in the previous step's
    sampled tokens (``ph_src``) they are."""
    ph_src: slice
    query_start: slice
    seq_lens: slice
    tables: slice
    state_idx: slice
    has_init: slice
    num_wide: int
    end: int

    @classmethod
    def of(cls, T: int, S: int, P: int, B: int, width: int, states: int = 0) -> "_Layout":
        ends = list(accumulate((T, T, T, S, P, P, B + 1, B, B * width, states, states)))
        starts = [0, *ends[:-1]]
        return cls(*(slice(a, b) for a, b in zip(starts, ends)), num_wide=ends[5], end=ends[-1])
