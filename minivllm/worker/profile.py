"""The start-up memory profile: what one step at its widest holds, on throw-away inputs.

The KV cache gets the memory the profile leaves (``Worker.determine_num_available_blocks``).
The worker has the model runner build what the profile needs first (``ModelRunner.prepare_profile``:
dummy images through the checkpoint's processor, whose loading and imports are no part of a
step's peak), then measures ``ModelRunner.profile_run``'s peak. This module makes its inputs;
the runner runs them through its own model, sampler and verifier, in this order:

- **the vision encoder** (a model that takes images) on the largest input one step may give it:
  the step's encoder budget (``min(scheduler.max_num_encoder_input_tokens,
  scheduler.encoder_cache_size)`` placeholder tokens: the scheduler encodes no more per step)
  filled with copies of the largest image the engine accepts (and one request of
  ``max_model_len`` tokens holds), no more than ``max_num_seqs`` requests of
  ``limit_mm_per_prompt`` images and ``max_model_len`` tokens hold. The images are made at the
  size the model's class names (``profile_image_size``) and go through the checkpoint's own
  processor, so the encoder sees the tensors a real request would bring, and are encoded as a
  step does (one batched call where the model allows) (``profile_images``);
- **a forward pass at the full token budget** on a throw-away KV cache and batch: a few long
  prompts that fill ``max_num_batched_tokens`` (``forward_batch``);
- **the sampler at its widest step.** The forward pass samples only a few rows; a decode step
  samples up to ``max_num_seqs`` rows (no more than ``max_num_batched_tokens``, one token each),
  and the sampler's working set is several (rows, vocab) fp32 tensors. So on the last pipeline
  stage the runner computes logits for ``sampler_rows`` copies of one hidden row and samples them
  for a batch of requests (``sampling_batch``) asking for every option that allocates
  (rows, vocab) (``profile_params``): every per-request number of ``sample/metadata.py``'s table
  at its ``profile`` value (temperature, min-p, top-k and top-p: a sort and its masks; the three
  penalties: the prompt mask and the output counts), allowed_token_ids (a mask) and logprobs up
  to ``model.max_logprobs`` (a log-softmax and its top-k). The metadata comes from the batch's
  own ``sampling_metadata``, as a request's would;
- **the verifier's widest step** with speculative decoding (``verify_rows``, ``verify_params``).
  A draft model (or EAGLE head) also holds each sampling request's (k, vocab) draft
  distributions between steps, so the profile holds as many through its forward pass and both
  sampling steps (``held_draft_probs``).

Left out: the structured-output bitmask (one more (rows, vocab) copy, and it needs xgrammar),
and per-request ``logits_processors`` (user code). A pooling runner samples nothing. LoRA
adapts no vocabulary layer, so the logits do not depend on the step's adapters.

What the peak leaves out but a running engine holds is reserved whole beside it: the encoder
cache, ``scheduler.encoder_cache_size`` rows of the language model's hidden size in the model's
dtype (``encoder_cache_bytes``; 0 for a text-only model, which builds none of the above); and for
an MLA model (DeepSeek V2/V3) the expanded context workspace (``mla_workspace_bytes``): the
profile's prompts have no earlier context, but a prefill chunk after a prefix-cache hit or earlier
chunks expands that context, one piece of ``attention/mla.py``'s ``CONTEXT_CHUNK_TOKENS`` positions
at a time, beside its new tokens' fp32 partial outputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from minivllm.attention.mla import context_workspace_bytes
from minivllm.config.vllm_config import VllmConfig
from minivllm.core.scheduler_output import NewRequestData
from minivllm.multimodal.feature import MultiModalFeature
from minivllm.multimodal.processing import load_multimodal_processor
from minivllm.request import RequestId
from minivllm.sample.metadata import ROW_PARAMS, may_speculate
from minivllm.sampling_params import SamplingParams
from minivllm.utils import cdiv
from minivllm.worker.input_batch import InputBatch


# ---- the forward pass -----------------------------------------------------------------------
def forward_batch(cfg: VllmConfig, device: torch.device) -> tuple[InputBatch, np.ndarray, int]:
    """The batch, its (B,) prompt lengths (``max_num_batched_tokens`` in all, as even as
    they can be, none over ``max_model_len``: fewer where ``max_num_seqs`` requests of
    ``max_model_len`` tokens cannot fill the budget, as no step can) and the KV blocks their tables cover."""
    budget, block_size = cfg.scheduler.max_num_batched_tokens, cfg.cache.block_size
    num_seqs = max(1, min(cfg.scheduler.max_num_seqs, cdiv(budget, cfg.max_model_len)))
    budget = min(budget, num_seqs * cfg.max_model_len)
    lens = [budget // num_seqs + (1 if i < budget % num_seqs else 0) for i in range(num_seqs)]
    blocks_per_seq = [cdiv(n, block_size) for n in lens]
    batch = InputBatch(num_seqs, cfg.max_model_len, cdiv(cfg.max_model_len, block_size), device)
    first_block = np.cumsum([0, *blocks_per_seq])
    for i, n in enumerate(lens):
        blocks = list(range(first_block[i], first_block[i + 1]))
        batch.add(NewRequestData(RequestId(str(i)), [0] * n, n, SamplingParams(), blocks, 0))
    return batch, np.asarray(lens, dtype=np.int32), sum(blocks_per_seq)


def mla_workspace_bytes(cfg: VllmConfig, num_heads: int, nope_dim: int, v_dim: int, latent_dim: int) -> int:
    """Most an MLA layer's prefill holds for earlier context on top of the profiled forward pass
    (``num_heads``: this rank's): one piece expanded (latents, per-head keys and values, model dtype)
    and the merge of the step's prefill rows (no more than ``max_num_batched_tokens``), five (rows, H,
    dv + 1) fp32 tensors at most: the running output and log-sum-exp, the piece's, and one merge's
    temporaries (``attention/mla.py``: ``merge_partials``)."""
    rows = cfg.scheduler.max_num_batched_tokens
    merge = 5 * rows * num_heads * (v_dim + 1) * 4
    return context_workspace_bytes(num_heads, nope_dim, v_dim, latent_dim, cfg.dtype) + merge


# ---- the sampler and the verifier -----------------------------------------------------------
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
    return SamplingParams(
        **{p.name: p.profile for p in ROW_PARAMS},
        allowed_token_ids=list(range(min(8, vocab_size))),
        logprobs=vocab_size if cap == -1 else min(cap, vocab_size),
    )


def verify_params() -> SamplingParams:
    """What a verified row may ask for: each per-request number that ``may_speculate`` allows
    (temperature, min-p, top-k and top-p; the penalties read the history, so requests with them,
    with logprobs or with other logit edits are never drafted)."""
    allowed = {p.name: p.profile for p in ROW_PARAMS if may_speculate(SamplingParams(**{p.name: p.profile}))}
    return SamplingParams(**allowed)


def sampling_batch(num_requests: int, params: SamplingParams, device: torch.device) -> InputBatch:
    """``num_requests`` requests of ``params``, each with a one-token prompt and one output token."""
    batch = InputBatch(num_requests, 2, 1, device)
    for i in range(num_requests):
        batch.add(NewRequestData(RequestId(f"profile-{i}"), [0, 1], 1, params, [], 0))
    return batch


def held_draft_probs(cfg: VllmConfig, device: torch.device) -> dict[RequestId, torch.Tensor]:
    """What a draft model holds between steps at most (``DraftModelProposer.draft_probs``): a (k, vocab)
    fp32 distribution per sampling request, ``max_num_seqs`` of them, in one allocation."""
    k = cfg.speculative.num_speculative_tokens
    held = torch.zeros(sampler_rows(cfg) * k, cfg.hf_text_config.vocab_size, dtype=torch.float32, device=device)
    return {RequestId(f"profile-{i}"): probs for i, probs in enumerate(held.split(k))}  # views of one tensor


# ---- the vision encoder ---------------------------------------------------------------------
def encoder_tokens_per_step(cfg: VllmConfig) -> int:
    """Most placeholder tokens the scheduler encodes in one step: its encoder budget, and no more
    than the encoder cache holds (both default to ``max_num_batched_tokens``)."""
    scheduler = cfg.scheduler
    budget = scheduler.max_num_encoder_input_tokens or scheduler.max_num_batched_tokens
    return min(budget, encoder_cache_rows(cfg))


def encoder_cache_rows(cfg: VllmConfig) -> int:
    return cfg.scheduler.encoder_cache_size or cfg.scheduler.max_num_batched_tokens


def encoder_cache_bytes(cfg: VllmConfig) -> int:
    """Bytes of a full encoder cache: its rows of the language model's hidden size, in the model's dtype."""
    return encoder_cache_rows(cfg) * cfg.hf_text_config.hidden_size * cfg.dtype.itemsize


def profile_images(cfg: VllmConfig, model: Any) -> list[MultiModalFeature]:
    """The largest encoder input of one step: copies of the largest accepted image, processed
    (empty when no image fits a step, so none is ever encoded)."""
    per_step = encoder_tokens_per_step(cfg)
    processor = load_multimodal_processor(cfg, model.image_token_id(cfg.hf_config))
    max_tokens = min(per_step, cfg.max_model_len)  # a larger image fits no request
    size = model.profile_image_size(cfg.hf_config, processor.hf_processor.image_processor, max_tokens)
    if size is None:
        return []
    image = processor.process_image(Image.new("RGB", size))
    count = min(per_step // image.length, max_images_per_step(cfg, image.length))
    return [MultiModalFeature(f"profile-{i}", "image", 0, image.length, image.data) for i in range(count)]


def max_images_per_step(cfg: VllmConfig, image_tokens: int) -> int:
    """Most images of ``image_tokens`` placeholders one step's requests hold: ``max_num_seqs``
    requests, each of at most ``limit_mm_per_prompt`` images and ``max_model_len`` tokens."""
    per_request = min(dict(cfg.model.limit_mm_per_prompt).get("image", 1), cfg.max_model_len // image_tokens)
    return cfg.scheduler.max_num_seqs * per_request
