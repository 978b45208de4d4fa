"""The sampler: logits in, one token per row out, batched on the device.

Order per step (vLLM's): logprobs of the raw logits when asked for; the
structured-output bitmask (disallowed tokens -inf); then the
request-specific edits (allowed/bad tokens, min_tokens, logit_bias, penalties);
greedy rows take the argmax of the edited logits; random rows apply temperature,
min-p and top-k / top-p, then draw.

Random rows use the exponential race (``argmax(p / q)`` with ``q ~ Exp(1)``),
which samples from ``p`` exactly and lets each seeded request draw its noise
from its own generator, so its tokens do not depend on the rest of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from minivllm.sample.metadata import SamplingMetadata
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
    def __init__(self, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.generator = generator
        """Noise for rows without their own seed (seeded by model.seed)."""

    def forward(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        """logits: (N, V) fp32, as the model produced them (left unchanged)."""
        raw = logits
        if meta.grammar_bitmask is not None:
            logits = apply_grammar_bitmask(logits, meta.grammar_bitmask)
        if meta.edits is not None:
            logits = meta.edits.apply(logits)
        greedy = greedy_tokens(logits)
        if meta.all_greedy:
            token_ids = greedy
        else:
            sampled = self._sample(self.process(logits, meta), meta)
            token_ids = torch.where(meta.temperature == 0.0, greedy, sampled)
        if meta.max_num_logprobs is None:
            return SamplerOutput(token_ids, None, None, None)
        return SamplerOutput(token_ids, *gather_logprobs(raw, token_ids, meta.max_num_logprobs))

    def process(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Temperature, then the min-p and top-k / top-p masks (masked entries become -inf)."""
        temp = torch.where(meta.temperature == 0.0, 1.0, meta.temperature)
        logits = logits / temp.unsqueeze(1)
        if meta.min_p is not None:
            probs = logits.softmax(dim=-1)
            floor = meta.min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
            logits = logits.masked_fill(probs < floor, float("-inf"))
        if meta.top_k is not None or meta.top_p is not None:
            logits = apply_top_k_top_p(logits, meta.top_k, meta.top_p)
        return logits

    def _sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        probs = logits.softmax(dim=-1)
        q = torch.empty_like(probs).exponential_(generator=self.generator)
        for row, gen in meta.generators.items():
            q[row].exponential_(generator=gen)
        return probs.div(q).argmax(dim=-1)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """(N,) int64: each row's ``argmax`` (the first largest entry; a NaN counts as largest).

    fp32 logits on the CPU take numpy's argmax, which is vectorized and about ten
    times faster than torch's at a few hundred rows; it picks the same index."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 2:
        return torch.from_numpy(logits.detach().numpy().argmax(axis=-1))
    return logits.argmax(dim=-1)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Keep each row's ``top_k`` largest logits and its smallest nucleus of mass ``top_p``."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (N, V)
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        ranks = torch.arange(logits.shape[-1], device=logits.device)
        drop |= ranks.unsqueeze(0) >= top_k.unsqueeze(1)
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
