"""Per-step sampling inputs, one row per request that samples this step.

The worker builds them from the persistent batch's per-row arrays
(``worker/sampling_metadata.py``) and reuses them while the batch's membership
and the sampling rows stay the same; only requests with logit edits (penalties,
bad words, min_tokens, ...) need their token history, and only they cost work
every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minivllm.sample.history import TokenHistory
from minivllm.sample.logits_processors import LogitsEdits
from minivllm.sampling_params import SamplingParams


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor
    """(N,) fp32; 0 rows are greedy."""
    top_k: torch.Tensor | None
    """(N,) int64, vocab size where off; None when no row uses it."""
    top_p: torch.Tensor | None
    """(N,) fp32, 1.0 where off; None when no row uses it."""
    min_p: torch.Tensor | None
    """(N,) fp32, 0.0 where off; None when no row uses it."""
    generators: dict[int, torch.Generator]
    """Row -> the request's own generator (requests with a seed)."""
    all_greedy: bool
    max_num_logprobs: int | None
    """Largest ``logprobs`` asked for in the batch; None when nobody asked."""
    edits: LogitsEdits | None = None
    """Penalties, logit_bias, allowed/bad tokens, min_tokens; None when no row asks."""
    grammar_bitmask: torch.Tensor | None = None
    """Structured outputs: (N, ceil(V / 32)) int32 allowed-token bits; None when no row has a grammar."""

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        generators: dict[int, torch.Generator],
        vocab_size: int,
        device: torch.device,
        token_ids: list[list[int]] | None = None,
        num_prompt_tokens: list[int] | None = None,
    ) -> "SamplingMetadata":
        """``token_ids``: each row's prompt + output so far, of which the first
        ``num_prompt_tokens`` are the prompt (penalties, bad words and min_tokens
        need them); None stands for empty prompts and outputs."""
        temps = [0.0 if p.greedy else p.temperature for p in params]
        top_k = [p.top_k if p.top_k > 0 else vocab_size for p in params]
        top_p = [p.top_p for p in params]
        min_p = [p.min_p for p in params]
        asked = [p.logprobs for p in params if p.logprobs is not None]
        token_ids = token_ids if token_ids is not None else [[] for _ in params]
        num_prompt_tokens = num_prompt_tokens if num_prompt_tokens is not None else [0] * len(params)
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            top_k=_tensor_if(top_k, vocab_size, torch.int64, device),
            top_p=_tensor_if(top_p, 1.0, torch.float32, device),
            min_p=_tensor_if(min_p, 0.0, torch.float32, device),
            generators=generators,
            all_greedy=all(t == 0.0 for t in temps),
            max_num_logprobs=max(asked) if asked else None,
            edits=LogitsEdits.build(params, TokenHistory(token_ids, num_prompt_tokens), vocab_size, device),
        )


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


def may_speculate(p: SamplingParams) -> bool:
    """Whether a request's sampling allows drafts (it reads neither history nor raw distribution).
    The scheduler proposes drafts and the worker's draft model drafts by this one rule."""
    return p.logprobs is None and p.structured_outputs is None and not has_logits_edits(p)


def _tensor_if(values: list, neutral, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    if all(v == neutral for v in values):
        return None
    return torch.tensor(values, dtype=dtype, device=device)
