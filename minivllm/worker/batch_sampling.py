"""The sampler's view of the persistent batch: ``SamplingMetadata`` for a step's rows.

Building the metadata reads every sampling row's parameters, so it is cached
under ``(batch.version, rows)``: it is rebuilt only when the batch's membership
or the step's sampling rows change. Two parts are per step whatever the cache:
seeded rows' generators (re-seeded for the position they sample) and logit
edits (penalties, bad words, logits processors read the token history).
"""

from __future__ import annotations

import numpy as np
import torch

from minivllm.sample.history import TokenHistory
from minivllm.sample.logits_processors import LogitsEdits
from minivllm.sample.metadata import SamplingMetadata, has_logits_edits
from minivllm.sampling_params import SamplingParams
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.sampling_metadata import from_batch


class BatchSampling:
    def __init__(self, batch: InputBatch, device: torch.device) -> None:
        self.batch = batch
        self.device = device
        self._key: tuple | None = None
        self._meta: SamplingMetadata | None = None
        self._edited: list[int] = []
        """Positions among the rows whose requests have logit edits."""
        self._seeded: list[int] = []
        """Positions among the rows whose requests have a seed."""
        self.num_logprobs: list[int | None] = []
        """Each row's ``logprobs`` (None: not asked), for the rows of the last ``metadata`` call."""

    def metadata(self, rows: np.ndarray, seq_lens: np.ndarray, vocab_size: int) -> SamplingMetadata:
        """rows: (S,) the sampling rows, ascending; seq_lens: (S,) their lengths after this step."""
        key = (self.batch.version, rows.tobytes())
        if key != self._key:
            params = [self.batch.params[r] for r in rows.tolist()]
            self._edited = [i for i, p in enumerate(params) if has_logits_edits(p)]
            self._seeded = [i for i, p in enumerate(params) if p.seed is not None]
            self.num_logprobs = [p.logprobs for p in params]
            self._meta = from_batch(self.batch, rows, vocab_size, self.device)
            self._key = key
        meta = self._meta
        meta.generators = {i: self.seeded_generator(int(rows[i]), int(seq_lens[i])) for i in self._seeded}
        meta.edits = self._logits_edits(rows, vocab_size) if self._edited else None
        return meta

    def seeded_generator(self, row: int, seq_len: int) -> torch.Generator:
        """The request's generator, re-seeded for the output position about to be
        sampled: the noise depends only on (seed, position), so a seeded request
        samples the same tokens whatever the batch and across preemptions."""
        params: SamplingParams = self.batch.params[row]
        position = seq_len - int(self.batch.num_prompt_tokens[row])
        generator = self.batch.generators[self.batch.req_ids[row]]
        return generator.manual_seed((params.seed * 1_000_003 + position) % (1 << 63))

    def _logits_edits(self, rows: np.ndarray, vocab_size: int) -> LogitsEdits | None:
        self.batch.store_sampled(wait=True)  # async scheduling may have a step in flight: its tokens are history
        token_ids: list[list[int]] = [[] for _ in range(len(rows))]
        num_prompt = [0] * len(rows)
        for i in self._edited:
            token_ids[i] = self.batch.tokens_of(int(rows[i]))
            num_prompt[i] = int(self.batch.num_prompt_tokens[rows[i]])
        params = [self.batch.params[r] for r in rows.tolist()]
        return LogitsEdits.build(params, TokenHistory(token_ids, num_prompt), vocab_size, self.device)
