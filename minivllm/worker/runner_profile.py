"""The model runner's start-up profile: one step at its widest, on throw-away inputs.

``ProfileRun`` is mixed into ``ModelRunner`` (it reads the runner's model, config, device,
pipeline stage, sampler and drafter). The worker builds what the profile needs first
(``prepare_profile``: dummy images through the checkpoint's processor), then measures
``profile_run``'s peak: the vision encoder on one step's largest input, a forward pass at
the full token budget on a throw-away KV cache and batch (``profile_batch.py``), and the
sampler (and the spec-decode verifier) at its widest step (``sampler_profile.py``). What
the peak leaves out but a running engine holds (the encoder cache) is ``encoder_cache_bytes``.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from minivllm.worker.encoder_profile import encoder_cache_bytes, profile_images
from minivllm.worker.profile_batch import profile_batch
from minivllm.worker.sampler_profile import (
    held_draft_probs,
    profile_metadata,
    sampler_rows,
    verify_metadata,
    verify_rows,
)

logger = logging.getLogger(__name__)


class ProfileRun:
    """The profile methods of ``ModelRunner``."""

    def encoder_cache_bytes(self) -> int:
        """Memory a full encoder cache holds, which the profile's peak leaves out (0 for text)."""
        return encoder_cache_bytes(self.cfg) if self.mm is not None else 0

    def prepare_profile(self) -> None:
        """What ``profile_run`` needs built before the caller starts measuring: for a model that
        takes images, the dummy images through the checkpoint's processor (its loading and imports
        are no part of a step's peak). Nothing for a text-only model."""
        if self.mm is not None:
            self.profile_images = profile_images(self.cfg, self.model)

    @torch.inference_mode()
    def profile_run(self) -> None:
        """The vision encoder on one step's largest input (models that take images, from
        ``prepare_profile``), then a forward pass at the full token budget on a throw-away
        cache and batch, then the sampler at its widest step (``sampler_profile.py``), so the caller
        can measure peak activation memory (``encoder_profile.py``)."""
        start = time.perf_counter()
        if self.mm is not None:
            images = self.profile_images if self.profile_images is not None else profile_images(self.cfg, self.model)
            self.profile_images = None
            outputs = self.mm.run_encoder(images)
            del outputs, images  # a step's encoder outputs go to the cache, which is reserved whole
        held = held_draft_probs(self.cfg, self.device) if self.drafter is not None else None  # between steps
        batch, lens, num_blocks = profile_batch(self.cfg, self.device)
        self.init_kv_cache(num_blocks)
        step = self.inputs.build(batch, np.arange(len(lens)), lens)
        step.meta.backend_data = self.attn_backend.prepare(step.meta, self.block_size)
        intermediate = self.pipeline.empty(int(lens.sum())) if self.pipeline and not self.pipeline.is_first else None
        hidden = self._forward(step.input_ids, step.positions, step.meta, intermediate)
        if self.pipeline is None or self.pipeline.is_last:
            last = hidden[step.logits_index]  # (B, hidden)
            self.model.compute_logits(last)
            if self.pooler is None:  # a pooling runner samples nothing
                self._profile_sampler(last[-1:])
        if self.drafter is not None:
            self.drafter.catch_up(step)
        self.release_kv_cache()
        del held
        if self.cfg.torch_compile:
            logger.info("Profile run with torch.compile of the small ops: %.1f s", time.perf_counter() - start)

    def _profile_sampler(self, row: torch.Tensor) -> None:
        """The sampler at its widest step, from copies of one (1, hidden) row; then the
        verifier's widest step with speculative decoding (``sampler_profile.py``)."""
        logits = self.model.compute_logits(row.expand(sampler_rows(self.cfg), -1))  # (S, vocab) fp32
        self.sampler(logits, profile_metadata(self.cfg, logits.shape[0], logits.shape[-1], self.device))
        del logits
        if self.spec is not None:
            logits = self.model.compute_logits(row.expand(verify_rows(self.cfg), -1))  # (N, vocab) fp32
            meta = verify_metadata(logits.shape[0], logits.shape[-1], self.device)
            self.spec.profile(logits, meta, self.cfg.speculative.num_speculative_tokens, self.drafter is not None)
