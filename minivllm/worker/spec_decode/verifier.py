"""The model runner's side of speculative decoding: drafts in, verified tokens out.

Before the step the scheduler's drafts are written into the persistent batch
right after each request's known tokens (without counting them as known), so
the step's inputs pick them up like any other token: a request with ``k``
drafts is one row of ``1 + k`` query tokens in the same forward pass as the
plain decode and prefill rows. After the forward the plain sampler runs as
usual; then the ``k + 1`` positions of each drafted request are verified
(``sample/rejection_sampler.py``) and replace its plain sample. Rejected drafts
leave KV behind in slots past the rolled-back ``num_computed_tokens``; the
next step overwrites them, and the blocks past it are dropped from the row's
table as the scheduler dropped them. The verifier is a request store of the batch
(``InputBatch.register``): it forgets the requests the batch forgets.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from minivllm.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from minivllm.distributed.parallel_state import broadcast_from_first
from minivllm.outputs import ModelRunnerOutput
from minivllm.request import RequestId
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.rejection_sampler import VerifyInputs, emitted_tokens, rejection_sample
from minivllm.sample.sampler import Sampler
from minivllm.utils import cdiv
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.step_inputs import StepInputs


class DraftVerifier:
    def __init__(self, sampler: Sampler, block_size: int, device: torch.device) -> None:
        self.sampler = sampler
        self.block_size = block_size
        self.device = device
        self._drafted: set[RequestId] = set()
        """Requests that had drafts in the last step (their block tables may shrink)."""

    def add(self, new: NewRequestData) -> None:
        """A request joins with no drafts."""

    def remove(self, req_id: RequestId) -> None:
        self._drafted.discard(req_id)

    def write_drafts(self, batch: InputBatch, scheduler_output: SchedulerOutput) -> None:
        """Place each request's drafts after its known tokens (they stay unknown)."""
        for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            row = batch.row_of[req_id]
            n = int(batch.num_tokens[row])
            batch.token_ids[row, n : n + len(drafts)] = drafts

    def roll_back_block_tables(self, batch: InputBatch, cached: CachedRequestData) -> None:
        """Drop the table entries past the computed tokens of rows that had drafts
        (the scheduler freed those blocks when it rolled the drafts back)."""
        for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens):
            if req_id in self._drafted:
                row = batch.row_of[req_id]
                keep = cdiv(computed, self.block_size)
                batch.block_table.num_blocks[row] = min(int(batch.block_table.num_blocks[row]), keep)
                self._drafted.discard(req_id)

    def verify(
        self,
        batch: InputBatch,
        step: StepInputs,
        scheduler_output: SchedulerOutput,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
        hidden: torch.Tensor,
        out: ModelRunnerOutput,
        draft_probs: dict[RequestId, torch.Tensor] | None = None,
    ) -> ModelRunnerOutput:
        """Replace the plain samples of drafted requests by their verified tokens.
        ``draft_probs``: the (k, V) distributions sampled drafts were drawn from (a draft
        model's); drafts without one are deterministic (one-hot)."""
        spec = scheduler_output.scheduled_spec_decode_tokens
        drafted = [(i, int(r)) for i, r in enumerate(step.rows.tolist()) if batch.req_ids[r] in spec]
        drafts = [spec[batch.req_ids[row]] for _, row in drafted]
        flat, rows, draft_ids, seq_lens = _verified_positions(batch, step, drafted, drafts)
        index = torch.tensor(flat, dtype=torch.int64, device=self.device)
        logits = compute_logits(hidden[index])  # (N, V) fp32
        meta = batch.sampling.metadata(rows)
        if draft_probs:
            probs = self.sampler.process(logits, meta).softmax(dim=-1)  # (N, V)
            inputs = self._noise(batch, rows, seq_lens, draft_ids, meta.temperature == 0.0, probs.shape)
            req_ids = [batch.req_ids[row] for _, row in drafted]
            inputs.draft_probs = _draft_prob_rows(req_ids, drafts, draft_probs, probs.shape, self.device)
            own, accepted = rejection_sample(logits, probs, inputs)
        else:
            own, accepted = self._sample_and_match(batch, logits, meta, rows, seq_lens, draft_ids)
        accepted = broadcast_from_first(accepted.to(torch.int64))  # every rank keeps the same tokens
        own = broadcast_from_first(own)
        own_host, accepted_host = own.tolist(), accepted.tolist()
        at = 0
        for (_, row), ds in zip(drafted, drafts):
            n = len(ds) + 1
            tokens = emitted_tokens(ds, own_host[at : at + n], [bool(a) for a in accepted_host[at : at + n]])
            at += n
            self._replace_sample(batch, row, tokens)
            out.sampled_token_ids[batch.req_ids[row]] = tokens
        self._drafted.update(spec)
        return out

    def profile(self, logits: torch.Tensor, meta: SamplingMetadata, k: int, with_draft_probs: bool) -> torch.Tensor:
        """The start-up memory profile's widest verification: ``logits`` (N, V) of N verified
        positions, ``k + 1`` per request (``worker/profile.py``); ``with_draft_probs``: a
        draft model's (N, V) distributions too. Returns (N,) each row's own token."""
        probs = self.sampler.process(logits, meta).softmax(dim=-1)  # (N, V)
        n = probs.shape[0]
        drafts = torch.zeros(n, dtype=torch.int64, device=self.device)
        drafts[k :: k + 1] = -1  # every request's bonus position
        uniform = torch.rand(n, device=self.device, generator=self.sampler.generator)
        expo = torch.empty_like(probs).exponential_(generator=self.sampler.generator)
        inputs = VerifyInputs(drafts, meta.temperature == 0.0, uniform, expo)
        if with_draft_probs:
            inputs.draft_probs = probs.clone()
        own, _ = rejection_sample(logits, probs, inputs)
        return own

    def _sample_and_match(
        self,
        batch: InputBatch,
        logits: torch.Tensor,
        meta: SamplingMetadata,
        rows: np.ndarray,
        seq_lens: list[int],
        draft_ids: list[int],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Deterministic drafts: every verified position is sampled as the plain sampler samples
        it (same processing, same per-(seed, position) noise, torch or fused), and a draft is
        accepted iff it equals that sample. For a one-hot ``q`` this is rejection sampling
        itself (the draft is accepted with probability ``p(d)``; otherwise the token is drawn
        from ``p`` without ``d``), and it shares its noise with plain sampling: a seeded request
        emits the same tokens with speculation as without, wherever its drafts fall.
        Returns (N,) int64 each row's own token and (N,) bool accepted."""
        meta.generators = {
            i: batch.sampling.generator(row, seq_lens[i] - int(batch.num_prompt_tokens[row]))
            for i, row in enumerate(rows.tolist())
            if row in batch.sampling.seeded
        }
        own = self.sampler(logits, meta).token_ids  # (N,)
        drafts = torch.tensor(draft_ids, dtype=torch.int64, device=own.device)
        return own, own == drafts

    def _noise(
        self,
        batch: InputBatch,
        rows: np.ndarray,
        seq_lens: list[int],
        draft_ids: list[int],
        greedy: torch.Tensor,
        shape: torch.Size,
    ) -> VerifyInputs:
        """Accept draws and exponential noise per row; seeded requests draw theirs from
        their own generator, re-seeded per output position (as the plain sampler does)."""
        uniform = torch.rand(shape[0], device=self.device, generator=self.sampler.generator)
        expo = torch.empty(shape, device=self.device).exponential_(generator=self.sampler.generator)
        for i, row in enumerate(rows.tolist()):
            if row in batch.sampling.seeded:
                gen = batch.sampling.generator(row, seq_lens[i] - int(batch.num_prompt_tokens[row]))
                uniform[i] = torch.rand(1, device=self.device, generator=gen)[0]
                expo[i].exponential_(generator=gen)
        drafts = torch.tensor(draft_ids, dtype=torch.int64, device=self.device)
        return VerifyInputs(drafts, greedy, uniform, expo)

    @staticmethod
    def _replace_sample(batch: InputBatch, row: int, tokens: list[int]) -> None:
        """The plain sampler appended one token to the row: put the verified ones in its place."""
        n = int(batch.num_tokens[row]) - 1
        batch.token_ids[row, n : n + len(tokens)] = tokens
        batch.num_tokens[row] = n + len(tokens)


def _verified_positions(
    batch: InputBatch, step: StepInputs, drafted: list[tuple[int, int]], drafts: list[list[int]]
) -> tuple[list[int], np.ndarray, list[int], list[int]]:
    """For the ``k + 1`` verified positions of each drafted (step index, batch row): their
    flat-batch index, batch row, draft token (-1 on the bonus position) and the sequence
    length at which that position's token is sampled."""
    flat, rows, draft_ids, seq_lens = [], [], [], []
    for (i, row), ds in zip(drafted, drafts):
        end, k = int(step.query_start[i + 1]), len(ds)
        flat.extend(range(end - k - 1, end))
        rows.extend([row] * (k + 1))
        draft_ids.extend([*ds, -1])
        computed = int(batch.num_computed_tokens[row])
        seq_lens.extend(range(computed + 1, computed + k + 2))
    return flat, np.asarray(rows, dtype=np.int64), draft_ids, seq_lens


def _draft_prob_rows(
    req_ids: list[RequestId],
    drafts: list[list[int]],
    draft_probs: dict[RequestId, torch.Tensor],
    shape: torch.Size,
    device: torch.device,
) -> torch.Tensor:
    """(N, V) q per verified position: the request's draft distribution where it has one,
    one-hot at the draft otherwise, zeros on bonus rows."""
    q = torch.zeros(shape, device=device)
    at = 0
    for req_id, ds in zip(req_ids, drafts):
        k = len(ds)
        sampled = draft_probs.get(req_id)
        if sampled is not None:
            q[at : at + k] = sampled[:k]
        else:
            q[torch.arange(at, at + k, device=device), torch.tensor(ds, device=device)] = 1.0
        at += k + 1
    return q
