"""What the start-up memory profile adds for a model that takes images.

The KV cache gets the memory the profile leaves (``Worker.determine_num_available_blocks``).
A vision-language model needs two things besides the language model's peak, and both must
be counted before the KV cache takes the rest:

- the vision encoder's activations on the largest input one step may give it: the step's
  encoder budget (``min(scheduler.max_num_encoder_input_tokens, scheduler.encoder_cache_size)``
  placeholder tokens: the scheduler encodes no more per step) filled with copies of the largest
  image the engine accepts (and one request of ``max_model_len`` tokens holds), no more than
  ``max_num_seqs`` requests of ``limit_mm_per_prompt`` images and ``max_model_len`` tokens
  hold. The images are made here, at the size the model's class names (``profile_image_size``), and go through the checkpoint's own processor, so the encoder sees
  the tensors a real request would bring. ``ModelRunner.prepare_profile`` makes them before the
  worker starts measuring (the processor's loading and imports are no part of a step's peak);
  ``ModelRunner.profile_run`` encodes them as a step does (one batched call where the model
  allows) inside the measured region.
- the encoder cache: ``scheduler.encoder_cache_size`` rows of the language model's hidden size
  in the model's dtype, held between steps (``MultiModalRunner.encoder_cache``), reserved whole.

A text-only model builds none of this: ``ModelRunner.mm`` is None and it reserves 0 bytes.
"""

from __future__ import annotations

from typing import Any

from PIL import Image

from minivllm.config.vllm_config import VllmConfig
from minivllm.multimodal.feature import MultiModalFeature
from minivllm.multimodal.processing import load_multimodal_processor


def encoder_tokens_per_step(cfg: VllmConfig) -> int:
    """Most placeholder tokens the scheduler encodes in one step: its encoder budget, and no more
    than the encoder cache holds (both default to ``max_num_batched_tokens``)."""
    sched = cfg.scheduler
    budget = sched.max_num_encoder_input_tokens or sched.max_num_batched_tokens
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
