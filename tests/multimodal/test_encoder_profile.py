"""The start-up memory profile of a vision-language model: the vision encoder runs, inside the
measured region, on the largest input one step may give it (as many of the largest accepted
images as the encoder budget and ``max_num_seqs`` allow, made by the checkpoint's processor),
and the whole encoder cache is reserved before the KV cache is sized. A text-only model's
profile does none of it."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoImageProcessor, AutoProcessor

from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.vllm_config import VllmConfig
from minivllm.models.llava import LlavaForConditionalGeneration
from minivllm.models.qwen2_vl import Qwen2VLForConditionalGeneration, largest_image_size
from minivllm.worker import profile as startup_profile
from minivllm.worker.model_runner import ModelRunner
from minivllm.worker.worker import Worker
from tests.models.qwen2_vl_checkpoint import MAX_PIXELS, MERGE, MIN_PIXELS, build_qwen2_vl
from tests.multimodal.llava_checkpoint import IMAGE_SIZE, NUM_IMAGE_TOKENS

MiB = 1 << 20
TOTAL, PEAK = 64 * MiB, 3 * MiB  # a stand-in for what the profile measures, where the test fixes it
BLOCK = 16


@pytest.fixture(scope="module")
def qwen2_vl_dir(tmp_path_factory, tokenizer_dir):
    return build_qwen2_vl(tmp_path_factory.mktemp("qwen2_vl_profile"), tokenizer_dir)


def _worker(path, *overrides: str) -> Worker:
    tree = config_from_kwargs(str(path), overrides, dtype="float32", max_model_len=128, block_size=BLOCK)
    worker = Worker(VllmConfig.from_dictconfig(tree))
    worker.init_device()
    worker.load_model()
    return worker


def _record_encoder_calls(monkeypatch, model_cls) -> list[dict]:
    """Every ``embed_multimodal`` call's tensors, and whether it ran inside ``ModelRunner.profile_run``
    (what ``Worker._profile_memory`` measures)."""
    calls: list[dict] = []
    inside = [False]
    encode, profile = model_cls.embed_multimodal, ModelRunner.profile_run

    def recording_encode(self, **data):
        calls.append({"in_profile": inside[0], **data})
        return encode(self, **data)

    def recording_profile(self):
        inside[0] = True
        try:
            return profile(self)
        finally:
            inside[0] = False

    monkeypatch.setattr(model_cls, "embed_multimodal", recording_encode)
    monkeypatch.setattr(ModelRunner, "profile_run", recording_profile)
    return calls


@pytest.mark.parametrize("max_num_seqs, images", [(8, 3), (2, 2)], ids=["budget", "max_num_seqs"])
def test_llava_profile_encodes_what_one_step_may(llava_dir, monkeypatch, max_num_seqs, images):
    """56 encoder tokens per step (the cache holds 64) take three 16-token images; two requests
    of one image each take two. They are the processor's tensors of an image of the tower's size."""
    calls = _record_encoder_calls(monkeypatch, LlavaForConditionalGeneration)
    worker = _worker(
        llava_dir,
        "scheduler.max_num_encoder_input_tokens=56",
        "scheduler.encoder_cache_size=64",
        f"scheduler.max_num_seqs={max_num_seqs}",
    )
    assert min(56, 64) // NUM_IMAGE_TOKENS == 3
    assert worker.determine_num_available_blocks() >= 1
    assert len(calls) == 1 and calls[0]["in_profile"]  # one batched call, measured
    expected = AutoProcessor.from_pretrained(llava_dir).image_processor(
        Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE)), return_tensors="pt"
    )["pixel_values"]  # (1, 3, 16, 16)
    torch.testing.assert_close(calls[0]["pixel_values"], expected.expand(images, -1, -1, -1))
    assert worker.model_runner.mm.num_encoded == 0  # the profile's images are no request's
    assert not worker.model_runner.mm.encoder_cache


def _bytes_per_block(config) -> int:
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * BLOCK * config.num_key_value_heads * head_dim * 4  # K and V, float32


def test_kv_cache_gives_way_to_the_encoder_cache(llava_dir, llama_dir, monkeypatch):
    """With the profile's measurement fixed, the VLM's KV blocks are those of (total x utilization
    - peak - encoder cache bytes); a text-only model's stay (total x utilization - peak)."""
    monkeypatch.setattr(Worker, "_profile_memory", lambda self: (float(TOTAL), float(PEAK)))
    cache_rows = 2000
    vlm, text_only = _worker(llava_dir, f"scheduler.encoder_cache_size={cache_rows}"), _worker(llama_dir)
    text = AutoConfig.from_pretrained(llava_dir).text_config
    encoder_cache = cache_rows * text.hidden_size * 4  # float32 rows of the language model's width
    assert vlm.model_runner.encoder_cache_bytes() == encoder_cache
    usable = TOTAL * vlm.cfg.cache.gpu_memory_utilization - PEAK
    per_block = _bytes_per_block(text)
    assert vlm.determine_num_available_blocks() == int((usable - encoder_cache) // per_block)
    assert int((usable - encoder_cache) // per_block) < int(usable // per_block)
    llama = AutoConfig.from_pretrained(llama_dir)
    assert text_only.model_runner.encoder_cache_bytes() == 0
    assert text_only.determine_num_available_blocks() == int(usable // _bytes_per_block(llama))


def test_text_only_profile_builds_no_encoder_input(llama_dir, monkeypatch):
    """Also: 8 requests of at most 128 tokens cannot fill the 2048-token budget; the profile's
    batch holds what a step could (it used to build 256-token requests and fail)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a text-only model's profile built encoder inputs")

    monkeypatch.setattr(startup_profile, "load_multimodal_processor", refuse)
    worker = _worker(llama_dir, "scheduler.max_num_seqs=8")
    assert worker.cfg.scheduler.max_num_batched_tokens > 8 * worker.cfg.max_model_len
    assert worker.model_runner.mm is None and worker.model_runner.encoder_cache_bytes() == 0
    assert worker.determine_num_available_blocks() >= 1


def test_qwen2_vl_profile_encodes_the_largest_images_in_one_call(qwen2_vl_dir, monkeypatch):
    """40 encoder tokens per step: images hold at most 16 tokens (max_pixels = 112 x 112), so
    two 112 x 112 images (8 x 8 patches each) in one call."""
    calls = _record_encoder_calls(monkeypatch, Qwen2VLForConditionalGeneration)
    worker = _worker(qwen2_vl_dir, "scheduler.max_num_encoder_input_tokens=40", "scheduler.encoder_cache_size=64")
    assert worker.determine_num_available_blocks() >= 1
    assert len(calls) == 1 and calls[0]["in_profile"]
    assert calls[0]["image_grid_thw"].tolist() == [[1, 8, 8], [1, 8, 8]]
    expected = AutoImageProcessor.from_pretrained(qwen2_vl_dir)(
        images=[Image.new("RGB", (112, 112))], return_tensors="pt"
    )["pixel_values"]
    torch.testing.assert_close(calls[0]["pixel_values"], torch.cat([expected, expected]))


@pytest.mark.parametrize("max_tokens", [1, 4, 5, 7, 12, 15, 16, 40])
def test_qwen2_vl_largest_image_against_every_size(qwen2_vl_dir, max_tokens):
    """The size chosen is one the image processor keeps, and no image of any size within its
    pixel bounds (sides in 28-pixel steps) gives more tokens without passing ``max_tokens``."""
    processor = AutoImageProcessor.from_pretrained(qwen2_vl_dir)
    unit = 14 * MERGE
    sides = range(unit, MAX_PIXELS // unit + 1, unit)
    best = max(
        (h * w // unit**2 for h, w in itertools.product(sides, sides) if MIN_PIXELS <= h * w <= MAX_PIXELS),
        key=lambda tokens: tokens if tokens <= max_tokens else -1,
    )
    size = largest_image_size(processor, max_tokens)
    if best > max_tokens:
        assert size is None
        return
    grid = processor(images=[Image.new("RGB", size)], return_tensors="pt")["image_grid_thw"][0]
    assert int(grid.prod()) // MERGE**2 == best
    assert grid[1:].tolist() == [size[1] // 14, size[0] // 14]  # kept as it is: height, width in patches
    assert math.prod(size) <= MAX_PIXELS


@pytest.mark.gpu
def test_cuda_profile_peak_includes_the_encoder_pass(llava_dir):
    """On CUDA the measured peak (``max_memory_allocated``) grows with the encoder input one step
    may hold: 256 images against 1, over the same 64-token language-model pass."""
    peaks = []
    for images in (1, 256):
        tokens = images * NUM_IMAGE_TOKENS
        worker = _worker(
            llava_dir,
            "device=cuda",
            "scheduler.max_num_batched_tokens=64",
            "scheduler.max_num_seqs=256",
            f"scheduler.max_num_encoder_input_tokens={tokens}",
            f"scheduler.encoder_cache_size={tokens}",
        )
        peaks.append(worker._profile_memory()[1])
        del worker
        torch.cuda.empty_cache()
    encoder_input = 255 * 3 * IMAGE_SIZE * IMAGE_SIZE * 4  # the extra images' float32 pixels alone
    assert peaks[1] - peaks[0] >= encoder_input


def test_qwen2_vl_profile_image_fits_max_model_len(qwen2_vl_dir, monkeypatch):
    """40 encoder tokens per step would take 16-token images, but no request of 12 tokens holds
    one: the profile encodes the largest image of at most 12 tokens, as many as the budget takes."""
    calls = _record_encoder_calls(monkeypatch, Qwen2VLForConditionalGeneration)
    tree = config_from_kwargs(
        str(qwen2_vl_dir),
        ["scheduler.max_num_encoder_input_tokens=40", "scheduler.encoder_cache_size=64"],
        dtype="float32",
        max_model_len=12,
        block_size=BLOCK,
    )
    worker = Worker(VllmConfig.from_dictconfig(tree))
    worker.init_device()
    worker.load_model()
    assert worker.determine_num_available_blocks() >= 1
    processor = AutoImageProcessor.from_pretrained(qwen2_vl_dir)
    width, height = largest_image_size(processor, 12)
    assert largest_image_size(processor, 40) != (width, height)  # the cap changes the choice
    grids = calls[0]["image_grid_thw"].tolist()
    assert grids == [[1, height // 14, width // 14]] * (40 // (width * height // (14 * MERGE) ** 2))
    assert all(t * h * w // MERGE**2 <= 12 for t, h, w in grids)


def test_llava_image_count_is_what_requests_of_max_model_len_hold(llava_dir, monkeypatch):
    """128 encoder tokens per step take eight 16-token images, and two requests of four images
    each would too; but a request of 40 tokens holds two images, so two requests hold four."""
    calls = _record_encoder_calls(monkeypatch, LlavaForConditionalGeneration)
    tree = config_from_kwargs(
        str(llava_dir),
        [
            "scheduler.max_num_encoder_input_tokens=128",
            "scheduler.encoder_cache_size=128",
            "scheduler.max_num_seqs=2",
            "+model.limit_mm_per_prompt.image=4",
        ],
        dtype="float32",
        max_model_len=40,
        block_size=BLOCK,
    )
    worker = Worker(VllmConfig.from_dictconfig(tree))
    worker.init_device()
    worker.load_model()
    assert worker.determine_num_available_blocks() >= 1
    assert 128 // NUM_IMAGE_TOKENS == 8 and 40 // NUM_IMAGE_TOKENS == 2
    assert calls[0]["pixel_values"].shape[0] == 2 * 2
