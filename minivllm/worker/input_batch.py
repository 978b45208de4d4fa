"""The persistent batch: the model runner's requests as rows of preallocated arrays.

A request joins the batch when the scheduler first sends it (``add``), keeps its
row while it runs, and leaves when the scheduler says to forget it (finished,
aborted or preempted: ``remove``). Between steps only deltas arrive (new blocks,
the computed-token count), and the runner appends the tokens it samples itself,
so nothing is rebuilt per step and nothing loops over tokens in Python::

    row  req_id  token_ids (max_num_reqs, max_model_len)   num_tokens  computed  block table  sampling ...
    0    "a"     [5 17 9 42 8 ...]                           5           4         [7 2]        temperature 0.0
    1    "c"     [5 3 3 ...]                                 3           2         [4]          temperature 0.7
    2    (free)

Two row-aligned tables ride along: the block tables (``BlockTable``) and the sampling
parameters (``SamplingRows``: one column per entry of ``sample/metadata.py``'s table).
The runner's other per-request stores (prompt logprobs, images, M-RoPE positions,
LoRA adapters, ...) ``register`` with the batch and gain and lose requests with it
(``RequestStore``), so membership changes in one place.

Rows stay dense: ``condense`` moves the last rows into the holes that removals
left, so rows ``0 .. num_reqs - 1`` are all occupied and a step over every
running request reads plain slices. ``version`` changes whenever a row's
request (and so its sampling parameters) changes, which lets the batch reuse
a step's sampling metadata until its membership changes (``sampling_metadata``).

The batch also holds a step's sampled ids until they are stored in its rows
(``hold_sampled``, ``store_sampled``): the ids are on the device at once, on the
host only after the step's one synchronization. A synchronous step's output is
read before the next step starts, which then stores its tokens; with async
scheduling the next step starts first, and its inputs read the tokens not yet
stored from the device (``prev_sampled``, ``prev_sampled_index``)::

    launch k: hold k | output of k read | launch k+1: store k, hold k+1 ...          (sync)
    launch k: hold k | launch k+1: hold k+1 (k+1's inputs read k's ids on the device)
                     | output of k read | launch k+2: store k, hold k+2 ...          (async)
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from functools import cached_property
from operator import itemgetter
from typing import Protocol

import numpy as np
import torch

from minivllm.core.scheduler_output import CachedRequestData, NewRequestData
from minivllm.request import RequestId
from minivllm.sample.logits_processors import LogitsEdits, TokenHistory
from minivllm.sample.metadata import SamplingMetadata, SamplingRows, has_logits_edits


class RequestStore(Protocol):
    """Per-request state kept beside the batch: it gains every request the batch gains and
    loses every request the batch forgets (``InputBatch.register``)."""

    def add(self, new: NewRequestData) -> None: ...

    def remove(self, req_id: RequestId) -> None: ...


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int, device: torch.device) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.device = device
        self.req_ids: list[RequestId | None] = [None] * max_num_reqs
        self.row_of: dict[RequestId, int] = {}
        self._free_rows: list[int] = []
        """Holes below ``num_rows`` left by removals (a heap: the lowest is reused first)."""
        self.num_rows = 0
        """One past the highest occupied row."""
        self.version = 0

        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        """Tokens known to this runner: the prompt, then every output it sampled or was sent."""
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.block_table = BlockTable(max_num_reqs, max_blocks_per_req)
        self.sampling = SamplingRows(max_num_reqs, device)
        self._stores: list[RequestStore] = []
        self._all_rows = np.arange(max_num_reqs)
        self._ones = np.ones(max_num_reqs, dtype=np.int32)
        for shared in (self._all_rows, self._ones):  # slices of them are handed out as a step's rows and counts
            shared.flags.writeable = False
        self._sampling_key: tuple | None = None
        """(version, rows) of the cached ``_sampling_meta``."""
        self._sampling_meta: SamplingMetadata | None = None
        self._edited: list[int] = []
        """Positions among the cached sampling rows whose requests have logit edits."""
        self._seeded: list[int] = []
        """Positions among the cached sampling rows whose requests have a seed."""
        self._held: list[SampledTokens] = []
        """Steps' sampled ids not stored in the rows yet, oldest first (``hold_sampled``)."""
        self.prev_sampled: SampledTokens | None = None
        """The last held step's sampled ids while not stored (async scheduling): the tokens past
        a row's known ones that the next step's inputs read on the device."""

    def rows_of(self, req_ids: list[RequestId]) -> Sequence[int]:
        """The rows of the given requests, in their order (all must be in the batch)."""
        if len(req_ids) < 2:  # itemgetter of one key returns the value itself
            return [self.row_of[r] for r in req_ids]
        return itemgetter(*req_ids)(self.row_of)  # one C call, however many requests

    def scheduled_rows(
        self, num_scheduled_tokens: dict[RequestId, int], num_tokens: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(B,) the rows with new tokens this step, in row order, and (B,) their counts
        (``num_scheduled_tokens``: the scheduler's per request, ``num_tokens`` in all). The
        common cases (every row scheduled; every row decoding one token) answer with slices of
        shared read-only arrays, so a decode step allocates nothing."""
        if len(num_scheduled_tokens) == self.num_rows == num_tokens:
            # Every request in the batch (scheduled ones all are) decodes one token.
            return self._all_rows[:num_tokens], self._ones[:num_tokens]
        ids = self.req_ids[: self.num_rows]
        n = np.fromiter((num_scheduled_tokens.get(r, 0) for r in ids), dtype=np.int32, count=len(ids))
        if n.all():
            return self._all_rows[: len(ids)], n
        rows = np.flatnonzero(n)
        return rows, n[rows]

    @property
    def num_reqs(self) -> int:
        return len(self.row_of)

    # ---- membership -----------------------------------------------------------------
    def register(self, store: RequestStore) -> None:
        """From now on ``store`` gains and loses requests with the batch (``add``, ``remove``)."""
        self._stores.append(store)

    def add(self, new: NewRequestData) -> int:
        """Give a request a row (its known tokens, blocks and sampling parameters), and hand
        it to every registered store."""
        if new.req_id in self.row_of:
            raise ValueError(f"request {new.req_id} is already in the batch")
        row = heapq.heappop(self._free_rows) if self._free_rows else self._grow()
        n = len(new.token_ids)
        if n > self.max_model_len:
            raise ValueError(f"request {new.req_id}: {n} tokens exceed max_model_len={self.max_model_len}")
        self.req_ids[row] = new.req_id
        self.row_of[new.req_id] = row
        self.token_ids[row, :n] = new.token_ids
        self.num_tokens[row] = n
        self.num_prompt_tokens[row] = new.num_prompt_tokens
        self.num_computed_tokens[row] = new.num_computed_tokens
        self.block_table.set_row(row, new.block_ids)
        self.sampling.set_row(row, new.sampling_params)
        self.version += 1
        for store in self._stores:
            store.add(new)
        return row

    def _grow(self) -> int:
        if self.num_rows >= self.max_num_reqs:
            raise RuntimeError(f"the batch is full ({self.max_num_reqs} rows): the scheduler exceeded max_num_seqs")
        self.num_rows += 1
        return self.num_rows - 1

    def remove(self, req_id: RequestId) -> int | None:
        """Take the request out of every registered store and free its row (None if it had
        none); ``condense`` fills the hole later."""
        for store in self._stores:
            store.remove(req_id)
        row = self.row_of.pop(req_id, None)
        if row is None:
            return None
        self.req_ids[row] = None
        self.block_table.clear_row(row)
        self.sampling.clear_row(row)
        heapq.heappush(self._free_rows, row)
        self.version += 1
        return row

    def condense(self) -> None:
        """Move the highest rows into the holes below them until rows ``0 .. num_reqs - 1`` are full."""
        while self._free_rows:
            hole = heapq.heappop(self._free_rows)
            last = self._last_occupied()
            if last < hole:  # this hole and every one after it lie above the occupied rows
                self._free_rows = []
                break
            self._move(last, hole)
        self.num_rows = self.num_reqs

    def _last_occupied(self) -> int:
        row = self.num_rows - 1
        while row >= 0 and self.req_ids[row] is None:
            row -= 1
        return row

    def _move(self, src: int, dst: int) -> None:
        req_id = self.req_ids[src]
        n = int(self.num_tokens[src])
        self.token_ids[dst, :n] = self.token_ids[src, :n]
        for arr in (self.num_tokens, self.num_prompt_tokens, self.num_computed_tokens):
            arr[dst] = arr[src]
        self.block_table.move_row(src, dst)
        self.block_table.clear_row(src)
        self.sampling.move_row(src, dst)
        self.req_ids[dst], self.req_ids[src] = req_id, None
        self.row_of[req_id] = dst
        self.num_rows = src
        self.version += 1

    # ---- per-step updates -------------------------------------------------------------
    def update_cached(self, cached: CachedRequestData, sampled_elsewhere: bool) -> None:
        """Requests already in the batch take the scheduler's ``num_computed_tokens`` as they
        are (rejected drafts make it go back) and gain their new blocks; ``sampled_elsewhere``
        (a pipeline stage other than the last): the tokens the last stage sampled are written in."""
        rows = self.rows_of(cached.req_ids)
        self.num_computed_tokens[np.asarray(rows)] = cached.num_computed_tokens
        if any(cached.new_block_ids):
            self.block_table.append_rows(rows, cached.new_block_ids)
        if cached.new_token_ids and sampled_elsewhere:
            for row, computed, tokens in zip(rows, cached.num_computed_tokens, cached.new_token_ids):
                if tokens:
                    self.write_output_tokens(row, computed, tokens)

    def append_tokens(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """The step's sampled tokens, vectorized: ``tokens`` (S,) one per given row, or (S, n)
        n per row (multi-step decoding), in order."""
        if tokens.ndim == 1:
            self.token_ids[rows, self.num_tokens[rows]] = tokens
            self.num_tokens[rows] += 1
            return
        n = tokens.shape[1]
        at = self.num_tokens[rows][:, None] + np.arange(n)  # (S, n)
        self.token_ids[np.asarray(rows)[:, None], at] = tokens
        self.num_tokens[rows] += n

    def write_output_tokens(self, row: int, position: int, tokens: list[int]) -> None:
        """Output tokens another rank sampled, at ``max(position, prompt length)`` on (pipeline stages)."""
        start = max(position, int(self.num_prompt_tokens[row]))
        end = start + len(tokens)
        self.token_ids[row, start:end] = tokens
        self.num_tokens[row] = max(int(self.num_tokens[row]), end)

    def tokens_of(self, row: int) -> list[int]:
        return self.token_ids[row, : self.num_tokens[row]].tolist()

    # ---- the sampler's inputs ---------------------------------------------------------
    def sampling_metadata(self, rows: np.ndarray, seq_lens: np.ndarray, vocab_size: int) -> SamplingMetadata:
        """The sampler's inputs for a step: ``rows`` (S,) the sampling rows, ascending; ``seq_lens``
        (S,) their lengths after this step. The rows' parameters (``SamplingRows.metadata``) are
        cached under ``(version, rows)``: rebuilt only when the batch's membership or the step's
        sampling rows change. Two parts are per step whatever the cache: seeded rows' generators
        (re-seeded for the position they sample) and logit edits (penalties, bad words, logits
        processors read the token history)."""
        key = (self.version, rows.tobytes())
        if key != self._sampling_key:
            params = [self.sampling.params[r] for r in rows.tolist()]
            self._edited = [i for i, p in enumerate(params) if has_logits_edits(p)]
            self._seeded = [i for i, p in enumerate(params) if p.seed is not None]
            self._sampling_meta = self.sampling.metadata(rows)
            self._sampling_key = key
        meta = self._sampling_meta
        positions = seq_lens - self.num_prompt_tokens[rows]
        meta.generators = {i: self.sampling.generator(int(rows[i]), int(positions[i])) for i in self._seeded}
        meta.edits = self._logits_edits(rows, vocab_size) if self._edited else None
        return meta

    def _logits_edits(self, rows: np.ndarray, vocab_size: int) -> LogitsEdits | None:
        self.store_sampled(wait=True)  # async scheduling may have a step in flight: its tokens are history
        token_ids: list[list[int]] = [[] for _ in range(len(rows))]
        num_prompt = [0] * len(rows)
        for i in self._edited:
            token_ids[i] = self.tokens_of(int(rows[i]))
            num_prompt[i] = int(self.num_prompt_tokens[rows[i]])
        params = [self.sampling.params[r] for r in rows.tolist()]
        return LogitsEdits.build(params, TokenHistory(token_ids, num_prompt), vocab_size, self.device)

    # ---- sampled tokens on their way --------------------------------------------------
    def hold_sampled(self, req_ids: list[RequestId], rows: np.ndarray, token_ids: torch.Tensor) -> SampledTokens:
        """Take a step's sampled ids: ``token_ids`` (S,) int64 on the device, for the requests
        ``req_ids`` in batch ``rows`` (ascending). Their copy to the host starts now; the
        batch stores them in the rows once they are read (``store_sampled``)."""
        sampled = SampledTokens(req_ids, rows, self.version, token_ids)
        self._held.append(sampled)
        self.prev_sampled = sampled
        return sampled

    def store_sampled(self, wait: bool = False) -> None:
        """Store held sampled tokens in their requests' rows, oldest first: every step but the
        last, and the last once its ids were read (its output taken); with ``wait`` every step,
        waiting for their copies (afterwards ``token_ids`` hold every token sampled). A step
        earlier than one already read was copied before it, so storing it does not wait."""
        held = self._held
        if not held:
            return
        stop = None if wait or held[-1].host is not None else -1  # -1: the last step stays held
        for sampled in held[:stop]:
            self._store(sampled)
        del held[:stop]
        self.prev_sampled = held[-1] if held else None

    def _store(self, sampled: SampledTokens) -> None:
        """The step's ``rows`` are its requests' while the batch is at its ``version`` (always
        so for a synchronous step); otherwise the requests still here are found by id."""
        tokens = sampled.read()
        if sampled.version == self.version:
            self.append_tokens(sampled.rows, tokens)
            return
        row_of = self.row_of
        rows = np.asarray([row_of.get(r, -1) for r in sampled.req_ids])
        keep = np.flatnonzero(rows >= 0)
        self.append_tokens(rows[keep], tokens[keep])

    def prev_sampled_index(self, rows: np.ndarray) -> np.ndarray:
        """(P,) int64: where in ``prev_sampled`` the requests in batch ``rows`` find their
        token (async scheduling's placeholders); each of them sampled in that step.
        While the batch is at that step's version its rows still hold the same
        requests, so a search in the ascending sampled rows tells (checked: a row
        that did not sample there falls through); otherwise, or then, by id (a
        request that did not sample there is a KeyError)."""
        sampled = self.prev_sampled
        if self.version == sampled.version:
            held_rows = sampled.rows
            found = np.searchsorted(held_rows, rows)  # (P,)
            if (found < len(held_rows)).all() and (held_rows[found.clip(max=len(held_rows) - 1)] == rows).all():
                return found
        index_of = sampled.index_of
        return np.fromiter((index_of[self.req_ids[r]] for r in rows.tolist()), dtype=np.int64, count=len(rows))


class BlockTable:
    """Block tables of the persistent batch: one preallocated row per batch row.

    Row ``r`` holds the physical block ids of the request in batch row ``r``, in
    order; only its first ``num_blocks[r]`` entries are meaningful::

        table (max_num_reqs, max_blocks_per_req) int32     num_blocks
        row 0: [ 7  2  9  0  0 ...]                         3
        row 1: [ 4  0  0  0  0 ...]                         1

    Tables grow in place as the scheduler hands out blocks; a request's row is
    written once when it joins the batch and then only appended to.
    """

    def __init__(self, max_num_reqs: int, max_blocks_per_req: int) -> None:
        self.table = np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int32)

    @property
    def max_blocks_per_req(self) -> int:
        return self.table.shape[1]

    def set_row(self, row: int, block_ids: list[int]) -> None:
        n = len(block_ids)
        self._check_room(row, n)
        self.table[row, :n] = block_ids
        self.num_blocks[row] = n

    def append_row(self, row: int, block_ids: list[int]) -> None:
        start = int(self.num_blocks[row])
        end = start + len(block_ids)
        self._check_room(row, end)
        self.table[row, start:end] = block_ids
        self.num_blocks[row] = end

    def append_rows(self, rows: list[int], new_block_ids: list[list[int] | None]) -> None:
        """``append_row(rows[i], new_block_ids[i])`` for every row given blocks (None or empty:
        none); ``rows`` are distinct (one per request). When each of them gets one block, as
        in a decode step where some requests filled theirs, the blocks go in with one
        assignment instead of one per row (and a row past its width fails before any is written)."""
        given = [i for i, blocks in enumerate(new_block_ids) if blocks]
        if not all(len(new_block_ids[i]) == 1 for i in given):
            for i in given:
                self.append_row(rows[i], new_block_ids[i])
            return
        at = np.fromiter((rows[i] for i in given), dtype=np.int64, count=len(given))  # distinct rows
        ends = self.num_blocks[at] + 1
        if len(at) and ends.max() > self.max_blocks_per_req:
            self._check_room(int(at[ends.argmax()]), int(ends.max()))
        self.table[at, ends - 1] = [new_block_ids[i][0] for i in given]
        self.num_blocks[at] = ends

    def move_row(self, src: int, dst: int) -> None:
        n = int(self.num_blocks[src])
        self.table[dst, :n] = self.table[src, :n]
        self.num_blocks[dst] = n

    def clear_row(self, row: int) -> None:
        self.num_blocks[row] = 0

    def _check_room(self, row: int, n: int) -> None:
        if n > self.max_blocks_per_req:
            raise ValueError(f"batch row {row}: {n} blocks exceed max_model_len's {self.max_blocks_per_req}")


class SampledTokens:
    """One step's sampled ids: on the device for the next step's inputs, and on their way
    to the host, where they are read once (``read``: the step's one synchronization)."""

    def __init__(self, req_ids: list[RequestId], rows: np.ndarray, version: int, token_ids: torch.Tensor) -> None:
        """``token_ids``: (S,) int64 on the device, or (S, n) for n decode steps run back to back."""
        self.req_ids = req_ids
        """The sampling requests, one per sampled id (row of ids)."""
        self.rows = rows
        """(S,) their batch rows, ascending, while the batch is at ``version``."""
        self.version = version
        self.device = token_ids if token_ids.ndim == 1 else token_ids[:, -1]
        """(S,) int64 on the device: each request's last sampled id (the next step's input)."""
        self._copy = to_host(token_ids)
        self._copied = record_event(token_ids.device)
        self.host: np.ndarray | None = None
        """(S,) or (S, n): the ids on the host, once read."""

    def read(self) -> np.ndarray:
        """(S,) or (S, n): the ids on the host; the first call waits for their copy."""
        if self.host is None:
            if self._copied is not None:
                self._copied.synchronize()
            self.host = self._copy.numpy()
        return self.host

    @cached_property
    def index_of(self) -> dict[RequestId, int]:
        """Request id -> its index in the sampled ids."""
        return {r: i for i, r in enumerate(self.req_ids)}


def to_host(t: torch.Tensor | None) -> torch.Tensor | None:
    """A copy of a device tensor into pinned host memory, started without waiting
    (``record_event`` then tells when it is done); a CPU tensor itself."""
    if t is None:
        return None
    if t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def record_event(device: torch.device) -> torch.cuda.Event | None:
    """An event after the work queued so far on a CUDA device (None elsewhere: nothing to wait for)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event
