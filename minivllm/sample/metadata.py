"""The sampler's inputs, and the one table of per-request numbers they are built from.

Every per-request number the sampler reads (temperature, top-k, top-p, min-p, the three
penalties) is one entry of ``ROW_PARAMS``: the field's name (the same in ``SamplingParams``
and ``SamplingMetadata``), the dtype of its column, the value at which it changes nothing,
and a value that makes the sampler do its work. Everything else follows from the table:

- ``SamplingRows`` keeps one preallocated column per entry, a row per request of the
  persistent batch (``set_row`` when a request joins, ``move_row`` when the batch condenses);
- ``SamplingRows.metadata`` gathers a step's rows into ``SamplingMetadata``: a (N,) tensor per
  entry, or None when every row holds the entry's neutral value (the sampler then skips it).
  It is the one way sampling inputs are made: the plain step (``InputBatch.sampling_metadata``,
  which adds the step's generators and logit edits), speculative decoding's verifier and
  draft model, and the start-up profile, which asks for every entry at its ``profile`` value.

A new per-request number is a ``SamplingParams`` field, an entry here and its
``SamplingMetadata`` field, and the op that reads it (``sampler.py``, or ``logits_processors.py``
for a penalty); and the server's request field, where it is exposed.

The worker reuses a step's metadata while the batch's membership and sampling rows stay the
same; only requests with logit edits (penalties, bad words, min_tokens, ...) need their token
history, and only they cost work every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from minivllm.sample.logits_processors import LogitsEdits
from minivllm.sampling_params import SamplingParams


@dataclass(frozen=True)
class RowParam:
    """One per-request number the sampler reads: a column of the batch, a (N,) tensor of a step."""

    name: str
    """The ``SamplingParams`` field it comes from and the ``SamplingMetadata`` field it goes to."""
    dtype: type
    neutral: float | None
    """The value that leaves the logits as they are: a step whose rows all hold it gets None
    (the sampler skips the op). None: always a tensor."""
    profile: float
    """A value at which the op does its work (and allocates what it allocates): the start-up
    profile samples with every entry at this value."""
    read: Callable[[SamplingParams], float] | None = None
    """The column's value for a request, where it is not the field as it is."""

    def of(self, params: SamplingParams) -> float:
        return self.read(params) if self.read is not None else getattr(params, self.name)


ROW_PARAMS: tuple[RowParam, ...] = (
    RowParam("temperature", np.float32, None, 0.8, read=lambda p: 0.0 if p.greedy else p.temperature),  # 0: greedy
    RowParam("top_k", np.int64, 0, 50, read=lambda p: max(p.top_k, 0)),  # -1 and 0 both keep every token
    RowParam("top_p", np.float32, 1.0, 0.9),
    RowParam("min_p", np.float32, 0.0, 0.05),
    RowParam("repetition_penalty", np.float32, 1.0, 1.1),
    RowParam("presence_penalty", np.float32, 0.0, 0.1),
    RowParam("frequency_penalty", np.float32, 0.0, 0.1),
)


@dataclass
class SamplingMetadata:
    """The sampler's inputs for N rows (``SamplingRows.metadata``); the (N,) tensors are
    ``ROW_PARAMS``' entries, None when every row holds the entry's neutral value."""

    temperature: torch.Tensor
    """(N,) fp32; 0 rows are greedy."""
    top_k: torch.Tensor | None
    """(N,) int64, 0 where off."""
    top_p: torch.Tensor | None
    """(N,) fp32, 1.0 where off."""
    min_p: torch.Tensor | None
    """(N,) fp32, 0.0 where off."""
    repetition_penalty: torch.Tensor | None
    """(N,) fp32, 1.0 where off."""
    presence_penalty: torch.Tensor | None
    """(N,) fp32, 0.0 where off."""
    frequency_penalty: torch.Tensor | None
    """(N,) fp32, 0.0 where off."""
    all_greedy: bool
    num_logprobs: list[int | None]
    """Each row's ``logprobs`` (None: not asked)."""
    max_num_logprobs: int | None
    """Largest ``logprobs`` asked for in the batch; None when nobody asked."""
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    """Row -> the request's own generator, seeded for the position it samples (requests with a seed)."""
    edits: LogitsEdits | None = None
    """Penalties' counts, logit_bias, allowed/bad tokens, min_tokens; None when no row asks."""
    grammar_bitmask: torch.Tensor | None = None
    """Structured outputs: (N, ceil(V / 32)) int32 allowed-token bits; None when no row has a grammar."""
    truncated_rows: np.ndarray | None = None
    """(F,) int64 the random rows (temperature > 0) asking for min-p, top-k or top-p, ascending;
    None when none does (the fused sampler truncates these rows alone)."""


class SamplingRows:
    """The sampling parameters of a batch's rows: each request's ``SamplingParams``, a column
    per ``ROW_PARAMS`` entry, and the generator of each request with a seed. Rows follow the
    batch's (``set_row``, ``clear_row``, ``move_row``, as its block table does)."""

    def __init__(self, max_rows: int, device: torch.device) -> None:
        self.device = device
        self.params: list[SamplingParams | None] = [None] * max_rows
        self.columns: dict[str, np.ndarray] = {
            p.name: np.full(max_rows, p.neutral or 0, dtype=p.dtype) for p in ROW_PARAMS
        }
        """Entry name -> (max_rows,) its value per row."""
        self.seeded: set[int] = set()
        """Rows of requests with a seed: they draw their noise from ``generator``."""

    def set_row(self, row: int, params: SamplingParams) -> None:
        self.params[row] = params
        for p in ROW_PARAMS:
            self.columns[p.name][row] = p.of(params)
        if params.seed is not None:
            self.seeded.add(row)

    def clear_row(self, row: int) -> None:
        self.params[row] = None
        self.seeded.discard(row)

    def move_row(self, src: int, dst: int) -> None:
        for column in self.columns.values():
            column[dst] = column[src]
        self.params[dst], self.params[src] = self.params[src], None
        if src in self.seeded:
            self.seeded.discard(src)
            self.seeded.add(dst)

    def metadata(self, rows: np.ndarray) -> SamplingMetadata:
        """The sampler's inputs for ``rows`` (in order; a row may repeat, as the verifier's
        ``k + 1`` positions per request do), without generators (they depend on the position
        sampled: ``generator``) and logit edits (they read the token history)."""
        tensors = {p.name: self._tensor(p, self.columns[p.name][rows]) for p in ROW_PARAMS}
        asked = [self.params[r].logprobs for r in rows.tolist()]
        given = [k for k in asked if k is not None]
        return SamplingMetadata(
            **tensors,
            all_greedy=not self.columns["temperature"][rows].any(),
            num_logprobs=asked,
            max_num_logprobs=max(given) if given else None,
            truncated_rows=self._truncated(rows),
        )

    def _truncated(self, rows: np.ndarray) -> np.ndarray | None:
        c = self.columns
        asks = (c["top_k"][rows] > 0) | (c["top_p"][rows] < 1.0) | (c["min_p"][rows] > 0.0)
        found = np.flatnonzero(asks & (c["temperature"][rows] > 0.0))
        return found if len(found) else None

    def _tensor(self, p: RowParam, values: np.ndarray) -> torch.Tensor | None:
        if p.neutral is not None and (values == p.neutral).all():
            return None
        return torch.from_numpy(values).to(self.device)

    def generator(self, row: int, position: int) -> torch.Generator:
        """A new generator for the row's output position ``position``: the noise depends only on
        (seed, position), so a seeded request samples the same tokens whatever the batch, across
        preemptions and whether a position is sampled plainly or verified after a draft."""
        seed = self.params[row].seed
        return torch.Generator(device=self.device).manual_seed((seed * 1_000_003 + position) % (1 << 63))


def has_logits_edits(p: SamplingParams) -> bool:
    """Whether a request needs ``LogitsEdits`` (and so its token history) when it samples."""
    return bool(
        p.needs_penalties
        or p.logit_bias
        or p.allowed_token_ids is not None
        or p._bad_words_token_ids
        or (p.min_tokens > 0 and p._all_stop_token_ids)
        or p.logits_processors  # per-request callables: the row-by-row slow path
    )


def may_run_ahead(p: SamplingParams) -> bool:
    """Whether a request's next tokens may be sampled before the host has seen the ones before them
    (decode steps run back to back: ``scheduler.num_scheduler_steps``): its sampling reads no
    token history and no grammar masks it."""
    return p.structured_outputs is None and not has_logits_edits(p)


def may_speculate(p: SamplingParams) -> bool:
    """Whether a request's sampling allows drafts: it may run ahead and reads no raw distribution
    (no logprobs). The scheduler proposes drafts and the worker's draft model drafts by this one rule."""
    return p.logprobs is None and may_run_ahead(p)
