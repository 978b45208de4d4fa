"""A prompt's images through the checkpoint's own Hugging Face processor, once per request.

Each image is run through the processor alone (``processor(text=<image token>,
images=[image])``): that gives its tensors (``pixel_values``, and whatever else the
model reads, e.g. ``image_grid_thw``) and how many placeholder tokens it becomes
(the count of the image token in the processor's expansion). Results are cached
by the image's content hash, so an image seen before is not processed again.
Then each image token of the prompt's ids is repeated that many times (a prompt
whose placeholders are already expanded is taken as it is), and every image
becomes a ``MultiModalFeature`` at its offset.

Without torchvision, the processor is built from a checkpoint's tokenizer and image
processor alone (``ImageOnlyProcessor``): transformers builds ``Qwen2VLProcessor``
only when torchvision is installed (its video half needs it), although images go
through the PIL image processor. Without torchvision the front end uses the
checkpoint's own image processor (``AutoImageProcessor``: resizing, patches,
``image_grid_thw``) and tokenizer instead, with each image token of the text
repeated once per embedding row of its image, the rule of the model's own
processor (Qwen2-VL: ``t * h * w / merge_size^2``).
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch
from PIL import Image

from minivllm.multimodal.feature import MultiModalFeature

TENSOR_KEYS_DROPPED = ("input_ids", "attention_mask")
TokensPerImage = Callable[[Any, dict[str, torch.Tensor], int], int]
"""(image processor, its output, image index) -> placeholder tokens of that image."""


def merged_grid_tokens(image_processor: Any, out: dict[str, torch.Tensor], index: int) -> int:
    """Qwen2-VL: one token per ``merge_size x merge_size`` block of the image's patch grid."""
    return int(out["image_grid_thw"][index].prod()) // image_processor.merge_size**2


TOKENS_PER_IMAGE: dict[str, TokensPerImage] = {"Qwen2VLForConditionalGeneration": merged_grid_tokens}
"""Architectures this processor stands in for, and their expansion rule."""


class ImageOnlyProcessor:
    """Called like a transformers processor: ``(text=..., images=[...], return_tensors="pt")``."""

    def __init__(self, tokenizer: Any, image_processor: Any, image_token: str, tokens_per_image: TokensPerImage):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.image_token = image_token
        self.tokens_per_image = tokens_per_image

    @classmethod
    def from_pretrained(cls, path: str, architecture: str, image_token_id: int, **kwargs: Any) -> "ImageOnlyProcessor":
        from transformers import AutoImageProcessor, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        image_processor = AutoImageProcessor.from_pretrained(path, **kwargs)
        token = tokenizer.convert_ids_to_tokens(image_token_id)
        return cls(tokenizer, image_processor, token, TOKENS_PER_IMAGE[architecture])

    def __call__(self, text: str, images: list[Any], return_tensors: str = "pt") -> dict[str, torch.Tensor]:
        out = dict(self.image_processor(images=images, return_tensors=return_tensors))
        pieces = text.split(self.image_token)
        if len(pieces) - 1 != len(images):
            raise ValueError(f"{len(images)} image(s) for {len(pieces) - 1} {self.image_token!r} token(s) in the text")
        expanded = pieces[0]
        for i, piece in enumerate(pieces[1:]):
            expanded += self.image_token * self.tokens_per_image(self.image_processor, out, i) + piece
        ids = self.tokenizer(expanded, add_special_tokens=False, return_tensors=return_tensors)
        return {**ids, **out}


@dataclass(frozen=True)
class ProcessedImage:
    identifier: str
    length: int
    data: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.data.values())


def image_hash(image: Image.Image, salt: str) -> str:
    """Content hash of the decoded pixels (mode, size, bytes) and the processor's identity."""
    h = hashlib.sha256(salt.encode())
    h.update(f"{image.mode}:{image.size}".encode())
    h.update(image.tobytes())
    return h.hexdigest()


class ProcessedImageCache:
    """Least-recently-used processed images, up to ``max_bytes`` of tensors."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, ProcessedImage] = OrderedDict()
        self._bytes = 0

    def get(self, key: str) -> ProcessedImage | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
        return item

    def put(self, item: ProcessedImage) -> None:
        if item.nbytes > self.max_bytes or item.identifier in self._items:
            return
        self._items[item.identifier] = item
        self._bytes += item.nbytes
        while self._bytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.nbytes


class MultiModalProcessor:
    """Images of one model: its HF processor, its placeholder token, the engine's limits."""

    def __init__(
        self,
        hf_processor: Any,
        image_token_id: int,
        *,
        max_images: int,
        max_item_tokens: int,
        cache_bytes: int,
        identity: str,
    ) -> None:
        self.hf_processor = hf_processor
        self.image_token_id = image_token_id
        self.image_token = hf_processor.tokenizer.convert_ids_to_tokens(image_token_id)
        self.max_images = max_images
        self.max_item_tokens = max_item_tokens
        """Most placeholder tokens of one image: the encoder budget of a step and its cache must hold it."""
        self.cache = ProcessedImageCache(cache_bytes)
        self.identity = identity
        self.num_processed = 0
        """Images run through the HF processor (cache misses); tests read it."""

    def process(self, ids: list[int], mm_data: Any) -> tuple[list[int], list[MultiModalFeature]]:
        """(prompt ids with placeholders expanded, one feature per image in prompt order)."""
        images = self._images(mm_data)
        processed = [self._process_image(image, i) for i, image in enumerate(images)]
        return self._expand(ids, processed)

    def process_image(self, image: Image.Image) -> ProcessedImage:
        """One image through the processor (or the cache): its tensors and placeholder count."""
        return self._process_image(image, 0)

    def _images(self, mm_data: Any) -> list[Image.Image]:
        if not isinstance(mm_data, dict):
            raise ValueError(
                f"multi_modal_data: must be a dict like {{'image': <PIL image or list>}}, got {mm_data!r:.60}"
            )
        unknown = sorted(set(mm_data) - {"image"})
        if unknown:
            raise ValueError(f"multi_modal_data: modality {unknown[0]!r} not supported; only 'image'")
        images = mm_data.get("image", [])
        images = list(images) if isinstance(images, (list, tuple)) else [images]
        for i, image in enumerate(images):
            if not isinstance(image, Image.Image):
                raise ValueError(
                    f"multi_modal_data['image'][{i}]: must be a PIL.Image.Image, got {type(image).__name__}"
                )
        self.check_image_count(len(images), "multi_modal_data['image']")
        return images

    def check_image_count(self, count: int, field: str) -> None:
        """ValueError naming ``field`` when ``count`` images are more than a prompt may hold
        (a server asks before fetching any of them)."""
        if count > self.max_images:
            raise ValueError(
                f"{field}: {count} images, more than the {self.max_images} allowed per "
                f"prompt (model.limit_mm_per_prompt.image={self.max_images})"
            )

    def _process_image(self, image: Image.Image, index: int) -> ProcessedImage:
        key = image_hash(image, self.identity)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        try:
            out = self.hf_processor(text=self.image_token, images=[image], return_tensors="pt")
        except Exception as err:  # noqa: BLE001 - the processor's errors are the input's
            raise ValueError(f"multi_modal_data['image'][{index}]: the image processor failed: {err}") from None
        length = int((out["input_ids"] == self.image_token_id).sum())
        if length > self.max_item_tokens:
            raise ValueError(
                f"multi_modal_data['image'][{index}]: becomes {length} tokens, more than one step's encoder budget "
                f"or encoder cache holds ({self.max_item_tokens}); raise scheduler.max_num_encoder_input_tokens "
                "and scheduler.encoder_cache_size"
            )
        data = {k: v for k, v in out.items() if k not in TENSOR_KEYS_DROPPED and isinstance(v, torch.Tensor)}
        item = ProcessedImage(key, length, data)
        self.num_processed += 1
        self.cache.put(item)
        return item

    def _expand(self, ids: list[int], images: list[ProcessedImage]) -> tuple[list[int], list[MultiModalFeature]]:
        token = self.image_token_id
        runs = _runs_of(ids, token)  # (start, length) of each run of placeholder tokens
        if sum(n for _, n in runs) == len(images):  # one token per image: expand each
            starts = [i for i, t in enumerate(ids) if t == token]
        elif [n for _, n in runs] == [im.length for im in images]:  # already expanded
            return ids, [_feature(im, start) for (start, _), im in zip(runs, images)]
        else:
            raise ValueError(
                f"multi_modal_data['image']: {len(images)} image(s) given, but the prompt holds "
                f"{sum(n for _, n in runs)} image placeholder token(s) ({self.image_token!r}); "
                f"put one {self.image_token!r} in the prompt per image"
            )
        out: list[int] = []
        features = []
        last = 0
        for start, image in zip(starts, images):
            out += ids[last:start]
            features.append(_feature(image, len(out)))
            out += [token] * image.length
            last = start + 1
        out += ids[last:]
        return out, features


def _feature(image: ProcessedImage, offset: int) -> MultiModalFeature:
    return MultiModalFeature(image.identifier, "image", offset, image.length, image.data)


def _runs_of(ids: list[int], token: int) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t != token:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def load_multimodal_processor(cfg: Any, image_token_id: int) -> MultiModalProcessor:
    """The processor of ``cfg``'s checkpoint (a ``VllmConfig`` of a model that takes images)."""
    path = str(cfg.checkpoint_dir) if cfg.checkpoint_dir is not None else cfg.model.path
    hf_processor = _hf_processor(path, cfg.architecture, image_token_id, cfg.model.trust_remote_code)
    sched = cfg.scheduler
    budget = sched.max_num_encoder_input_tokens or sched.max_num_batched_tokens
    cache_size = sched.encoder_cache_size or sched.max_num_batched_tokens
    return MultiModalProcessor(
        hf_processor,
        image_token_id,
        max_images=dict(cfg.model.limit_mm_per_prompt).get("image", 1),
        max_item_tokens=min(budget, cache_size),
        cache_bytes=int(cfg.model.mm_processor_cache_gb * 2**30),
        identity=f"{path}:{cfg.architecture}",
    )


def _hf_processor(path: str, architecture: str, image_token_id: int, trust_remote_code: bool) -> Any:
    """The checkpoint's ``AutoProcessor``; without torchvision, where transformers cannot build
    it (Qwen2-VL's video half), the tokenizer and image processor alone (``ImageOnlyProcessor``)."""
    if architecture in TOKENS_PER_IMAGE and importlib.util.find_spec("torchvision") is None:
        return ImageOnlyProcessor.from_pretrained(path, architecture, image_token_id)
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
