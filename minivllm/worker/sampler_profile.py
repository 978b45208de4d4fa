"""What the start-up memory profile adds for the sampler: one sampling step at its widest.

The profile's forward pass (``ModelRunner.profile_run``) fills the token budget with a few long
prompts, so it samples only a few rows; a decode step samples up to ``max_num_seqs`` rows (no
more than ``max_num_batched_tokens``, one token each), and the sampler's working set is several
(rows, vocab) fp32 tensors. So the profile, inside the measured region and on the last pipeline
stage, computes logits for ``sampler_rows`` copies of one hidden row and runs the real sampler on
them with every option that allocates (rows, vocab): temperature, min-p, top-k and top-p (a sort
and its masks), allowed_token_ids (a mask), the three penalties (the prompt mask and the output
counts) and logprobs up to ``model.max_logprobs`` (a log-softmax and its top-k). The metadata
comes from the sampler's own builder (``SamplingMetadata.build``), as a request's would.

Left out: the structured-output bitmask (one more (rows, vocab) copy, and it needs xgrammar),
and per-request ``logits_processors`` (user code). A pooling runner samples nothing.
With speculative decoding the verifier's widest step is profiled too (``verify_rows``); a draft
model (or EAGLE head) also holds each sampling request's (k, vocab) draft distributions between
steps, so the profile holds as many through its forward pass and both sampling steps
(``held_draft_probs``).
LoRA adapts no vocabulary layer, so the logits do not depend on the step's adapters.
"""

from __future__ import annotations

import torch

from minivllm.config.vllm_config import VllmConfig
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sampling_params import SamplingParams


def sampler_rows(cfg: VllmConfig) -> int:
    """Most rows one step samples: one per request, one token each."""
    return max(1, min(cfg.scheduler.max_num_seqs, cfg.scheduler.max_num_batched_tokens))


def verify_rows(cfg: VllmConfig) -> int:
    """Most rows one speculative step verifies: ``k + 1`` per request, within the token budget."""
    per_request = cfg.speculative.num_speculative_tokens + 1
    return max(1, min(cfg.scheduler.max_num_seqs * per_request, cfg.scheduler.max_num_batched_tokens))


def profile_params(cfg: VllmConfig, vocab_size: int) -> SamplingParams:
    """A request asking for every sampling option that allocates (rows, vocab)."""
    cap = cfg.model.max_logprobs
    logprobs = vocab_size if cap == -1 else min(cap, vocab_size)
    return SamplingParams(
        temperature=0.8,
        top_p=0.9,
        top_k=50,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.1,
        frequency_penalty=0.1,
        allowed_token_ids=list(range(min(8, vocab_size))),
        logprobs=logprobs,
    )


def profile_metadata(cfg: VllmConfig, num_rows: int, vocab_size: int, device: torch.device) -> SamplingMetadata:
    """``num_rows`` rows of ``profile_params``, each with a one-token prompt and one output token."""
    params = [profile_params(cfg, vocab_size)] * num_rows
    return SamplingMetadata.build(params, {}, vocab_size, device, [[0, 1]] * num_rows, [1] * num_rows)


def verify_metadata(num_rows: int, vocab_size: int, device: torch.device) -> SamplingMetadata:
    """What a verified row may ask for: temperature, min-p, top-k and top-p (requests with
    logprobs or logit edits are never drafted: ``may_speculate``)."""
    params = [SamplingParams(temperature=0.8, top_p=0.9, top_k=50, min_p=0.05)] * num_rows
    return SamplingMetadata.build(params, {}, vocab_size, device)


def held_draft_probs(cfg: VllmConfig, device: torch.device) -> torch.Tensor:
    """(max_num_seqs * k, vocab) fp32: the draft distributions a draft model holds at most."""
    rows = sampler_rows(cfg) * cfg.speculative.num_speculative_tokens
    return torch.zeros(
        rows, cfg.hf_text_config.vocab_size, dtype=torch.float32, device=device
    )  # resident on the CPU too
