"""The image side of ``task=bench``: the ``images`` workload (each request some random
images ahead of random text) and the image model's placeholder tokens, which random text
must never hold (a prompt with placeholders and no image is refused).

The engine expands each placeholder to the image's feature count, so a request's prompt
grows by the image's tokens; the throughput counts the expanded prompts.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from minivllm.bench.workloads import BenchRequest, check_fits, random_ids
from minivllm.config.task import BenchConfig
from minivllm.config.vllm_config import VllmConfig

PLACEHOLDER_KEYS = ("image_token_id", "image_token_index", "video_token_id")


def placeholder_token_ids(cfg: VllmConfig) -> frozenset[int]:
    """The ids a prompt may hold only with images: the model's image (and video) tokens."""
    if not cfg.is_multimodal:
        return frozenset()
    hf = cfg.hf_config
    return frozenset(int(getattr(hf, key)) for key in PLACEHOLDER_KEYS if getattr(hf, key, None) is not None)


def image_token_id(cfg: VllmConfig) -> int:
    """The placeholder of one image in a prompt (expanded by the engine)."""
    from minivllm.models.registry import ModelRegistry

    if not cfg.is_multimodal:
        raise ValueError(
            f"bench.workload=images: model {cfg.model.path!r} ({cfg.architecture}) takes no images; "
            "use a vision-language checkpoint (python -m tools.tiny_vlm llava DIR builds a tiny one)"
        )
    return int(ModelRegistry.resolve(cfg.architecture).image_token_id(cfg.hf_config))


def random_image(size: int, rng: np.random.Generator) -> Image.Image:
    return Image.fromarray(rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8))


def image_requests(cfg: VllmConfig) -> list[BenchRequest]:
    """``bench.num_prompts`` requests: ``images_per_request`` placeholders, then random text of
    [min_input_len, max_input_len] tokens; distinct random images (no encoder-cache sharing)."""
    bench: BenchConfig = cfg.bench
    placeholder = image_token_id(cfg)
    limit = dict(cfg.model.limit_mm_per_prompt).get("image", 1)
    if bench.images_per_request > limit:
        raise ValueError(
            f"bench.images_per_request={bench.images_per_request}: more than model.limit_mm_per_prompt's "
            f"image limit {limit}; raise it (+model.limit_mm_per_prompt.image=N)"
        )
    rng = np.random.default_rng(bench.seed)
    exclude = placeholder_token_ids(cfg) | {placeholder}
    vocab_size = cfg.hf_text_config.vocab_size
    text_lens = rng.integers(bench.min_input_len, bench.max_input_len + 1, size=bench.num_prompts).tolist()
    outputs = rng.integers(bench.min_output_len, bench.max_output_len + 1, size=bench.num_prompts).tolist()
    requests = []
    for n, m in zip(text_lens, outputs):
        images = tuple(random_image(bench.image_size, rng) for _ in range(bench.images_per_request))
        ids = [placeholder] * bench.images_per_request + random_ids(n, vocab_size, rng, exclude)
        requests.append(BenchRequest(ids, m, images))
    check_fits(requests, cfg.max_model_len)  # before expansion: the engine refuses what still does not fit
    return requests
