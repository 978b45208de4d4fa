"""The sampler: logits in, one token per row out, batched on the device.

Order per step (vLLM's): logprobs of the raw logits when asked for; the
structured-output bitmask (disallowed tokens -inf); then the
request-specific edits (allowed/bad tokens, min_tokens, logit_bias, penalties);
greedy rows take the argmax of the edited logits; random rows apply temperature,
min-p and top-k / top-p, then draw.

Random rows use the exponential race (``argmax(p / q)`` with ``q ~ Exp(1)``),
which samples from ``p`` exactly and lets each seeded request draw its noise
from its own generator, so its tokens do not depend on the rest of the batch.

``compilation.fused_sampler`` (on by default on CUDA) replaces the greedy argmax, the
temperature, the softmax and the race by one Triton pass over the logits
(``triton_sampler.py``: the Gumbel-max form of the same race, Philox noise per request).
The bitmask and the logit edits still run before it as torch ops, logprobs after it from the
raw logits, and min-p / top-k / top-p run as torch ops on the rows that ask for them only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.triton_sampler import fused_sample
from minivllm.structured_output.backend import apply_grammar_bitmask


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor
    """(N,) int64."""
    logprobs: torch.Tensor | None
    """(N, 1 + k) fp32: the chosen token's logprob, then the top-k; None when nobody asked."""
    logprob_token_ids: torch.Tensor | None
    """(N, 1 + k) int64: the ids matching ``logprobs``."""
    logprob_ranks: torch.Tensor | None
    """(N,) int64: each chosen token's 1-based rank in the vocabulary."""


class Sampler(nn.Module):
    def __init__(self, generator: torch.Generator | None = None, fused: bool = False) -> None:
        super().__init__()
        self.generator = generator
        """Noise for rows without their own seed (seeded by model.seed); the fused path keys
        their Philox streams with its seed."""
        self.fused = fused
        """Sample with the fused Triton kernel (``compilation.fused_sampler``)."""
        self.num_fused_steps = 0
        """Fused steps so far: unseeded rows' Philox offsets differ from step to step by it."""

    def forward(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        """logits: (N, V) fp32, as the model produced them (left unchanged)."""
        raw = logits
        if meta.grammar_bitmask is not None:
            logits = apply_grammar_bitmask(logits, meta.grammar_bitmask)
        if meta.edits is not None:
            logits = meta.edits.apply(logits, meta)
        if self.fused:
            token_ids = self.sample_fused(logits, meta)
        else:
            token_ids = self._sample_torch(logits, meta)
        if meta.max_num_logprobs is None:
            return SamplerOutput(token_ids, None, None, None)
        return SamplerOutput(token_ids, *gather_logprobs(raw, token_ids, meta.max_num_logprobs))

    def _sample_torch(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        greedy = greedy_tokens(logits)
        if meta.all_greedy:
            token_ids = greedy
        else:
            sampled = self._sample(self.process(logits, meta), meta)
            token_ids = torch.where(meta.temperature == 0.0, greedy, sampled)
        return token_ids

    def process(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Temperature, then the min-p and top-k / top-p masks (masked entries become -inf)."""
        return truncate(logits, meta.temperature, meta.top_k, meta.top_p, meta.min_p)

    def sample_fused(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """(N,) int64 from the fused kernel: the same distribution per row as ``_sample_torch``
        (greedy rows: the same token). Rows asking for min-p / top-k / top-p (``meta.truncated_rows``)
        are processed by ``truncate`` first, those rows alone."""
        n = logits.shape[0]
        seeds, offsets = self.philox_inputs(meta, n, logits.device)
        masked = masked_rows = None
        if meta.truncated_rows is not None:
            rows = meta.truncated_rows
            index = np.full(n, -1, dtype=np.int32)
            index[rows] = np.arange(len(rows), dtype=np.int32)
            masked_rows = torch.from_numpy(index).to(logits.device, non_blocking=True)
            take = torch.from_numpy(rows).to(logits.device, non_blocking=True)
            top_k, top_p, min_p = (None if t is None else t[take] for t in (meta.top_k, meta.top_p, meta.min_p))
            masked = truncate(logits[take].float(), meta.temperature[take], top_k, top_p, min_p)  # (F, V)
        return fused_sample(logits, meta.temperature, seeds, offsets, masked, masked_rows)

    def philox_inputs(self, meta: SamplingMetadata, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's Philox key and offset ((N,) int64 each, on ``device``, one copy): a seeded row
        its generator's seed (made from the request's seed and the position it samples, so its
        draws follow the request, never the batch) at offset 0; every other row the engine
        generator's seed at ``step * 2**20 + row + 1``."""
        keys = np.empty((2, n), dtype=np.int64)
        keys[0] = (self.generator.initial_seed() if self.generator is not None else 0) & (2**63 - 1)
        keys[1] = self.num_fused_steps * 2**20 + np.arange(1, n + 1)
        self.num_fused_steps += 1
        for row, gen in meta.generators.items():
            keys[0, row] = gen.initial_seed() & (2**63 - 1)
            keys[1, row] = 0
        both = torch.from_numpy(keys).to(device, non_blocking=True)
        return both[0], both[1]

    def _sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        probs = logits.softmax(dim=-1)
        q = torch.empty_like(probs).exponential_(generator=self.generator)
        for row, gen in meta.generators.items():
            q[row].exponential_(generator=gen)
        return probs.div(q).argmax(dim=-1)


def truncate(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
) -> torch.Tensor:
    """``logits`` (N, V) over ``temperature`` (N,) (0 reads as 1), then the min-p and top-k / top-p
    masks of the (N,) tensors given (masked entries become -inf)."""
    temp = torch.where(temperature == 0.0, 1.0, temperature)
    logits = logits / temp.unsqueeze(1)
    if min_p is not None:
        probs = logits.softmax(dim=-1)
        floor = min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
        logits = logits.masked_fill(probs < floor, float("-inf"))
    if top_k is not None or top_p is not None:
        logits = apply_top_k_top_p(logits, top_k, top_p)
    return logits


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """(N,) int64: each row's ``argmax`` (the first largest entry; a NaN counts as largest).

    fp32 logits on the CPU take numpy's argmax, which is vectorized and about ten
    times faster than torch's at a few hundred rows; it picks the same index."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2:
        return torch.from_numpy(logits.detach().numpy().argmax(axis=-1))
    return logits.argmax(dim=-1)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Keep each row's ``top_k`` largest logits (all where it is 0) and its smallest nucleus of mass ``top_p``."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (N, V)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        vocab_size = logits.shape[-1]
        ranks = torch.arange(vocab_size, device=logits.device)
        drop |= ranks.unsqueeze(0) >= torch.where(top_k > 0, top_k, vocab_size).unsqueeze(1)
    if top_p is not None:
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of strictly better tokens
        drop |= mass_before >= top_p.unsqueeze(1)
    drop[:, 0] = False  # the most likely token always survives
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def gather_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw-model logprobs of the chosen tokens and of the top ``k`` (two (N, 1 + k)
    tensors), and each chosen token's rank: (N,), 1 + the count of strictly more
    likely tokens, so ties share the better rank."""
    logprobs = logits.log_softmax(dim=-1)  # (N, V)
    chosen = logprobs.gather(-1, token_ids.unsqueeze(1))  # (N, 1)
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    if k == 0:
        return chosen, token_ids.unsqueeze(1), ranks
    top_vals, top_ids = logprobs.topk(k, dim=-1)
    return torch.cat((chosen, top_vals), dim=1), torch.cat((token_ids.unsqueeze(1), top_ids), dim=1), ranks
