"""task=bench with images (bench=multimodal) on the tiny LLaVA: the images are all sent and
encoded, the rates and the vision encoder's share of step time are consistent; random text
never holds an image placeholder; bad settings are refused before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest

from minivllm.bench.run import _workload
from minivllm.bench.workloads import placeholder_token_ids, random_ids
from minivllm.cli.main import run
from minivllm.config.store import build_config, compose
from tests.multimodal.llava_checkpoint import NUM_IMAGE_TOKENS

SMALL = [
    "task=bench",
    "bench=multimodal",
    "bench.num_prompts=3",
    "bench.images_per_request=2",
    "bench.image_size=24",
    "bench.min_input_len=4",
    "bench.max_input_len=10",
    "bench.min_output_len=3",
    "bench.max_output_len=5",
    "bench.progress=false",
    "+model.limit_mm_per_prompt.image=2",
    "cache.block_size=8",
    "cache.num_gpu_blocks_override=64",
]


def test_image_bench_counts_images_and_times_the_encoder(llava_dir, tmp_path):
    metrics = run(compose([f"model.path={llava_dir}", *SMALL]), tmp_path)
    assert json.loads((tmp_path / "metrics.json").read_text()) == json.loads(json.dumps(metrics))
    requests, _ = _workload(build_config([f"model.path={llava_dir}", *SMALL]))
    assert metrics["images"] == metrics["images_encoded"] == 3 * 2
    assert 1 <= metrics["encoder_calls"] < metrics["images_encoded"]  # a step's images share a call
    seconds = metrics["total_time_s"]
    assert metrics["images_per_s"] == pytest.approx(6 / seconds)
    assert metrics["output_tokens"] == metrics["requested_output_tokens"] == sum(r.max_tokens for r in requests)
    assert metrics["output_tokens_per_s"] == pytest.approx(metrics["output_tokens"] / seconds)
    text_tokens = sum(len(r.prompt_token_ids) for r in requests) - 6  # each placeholder becomes the image's rows
    assert metrics["input_tokens"] == text_tokens + 6 * NUM_IMAGE_TOKENS
    engine = metrics["engine"]
    assert 0 < engine["encoder_fraction"] < 1
    assert engine["encoder_time_s"] == pytest.approx(engine["encoder_fraction"] * engine["step_time_s"])
    assert engine["overhead_s"] == pytest.approx(
        engine["step_time_s"] - engine["model_time_s"] - engine["encoder_time_s"]
    )


def test_random_text_never_holds_a_placeholder(llava_dir):
    cfg = build_config([f"model.path={llava_dir}", "task=bench", "bench.num_prompts=200", "bench.min_input_len=100"])
    image_id = cfg.hf_config.image_token_index
    assert placeholder_token_ids(cfg) == {image_id}
    requests, single = _workload(cfg)  # ~20k draws over a vocabulary of ~500: dozens would be the image token
    assert all(image_id not in r.prompt_token_ids for r in [*requests, single])
    ids = random_ids(5000, 4, np.random.default_rng(0), exclude={1, 3})
    assert set(ids) == {0, 2}


def test_bad_image_settings_are_refused(llava_dir, opt_dir):
    with pytest.raises(ValueError, match="bench.workload=images: model .* takes no images"):
        _workload(build_config([f"model.path={opt_dir}", "task=bench", "bench=multimodal"]))
    with pytest.raises(ValueError, match="bench.images_per_request=3: more than model.limit_mm_per_prompt"):
        _workload(
            build_config([f"model.path={llava_dir}", "task=bench", "bench=multimodal", "bench.images_per_request=3"])
        )
    with pytest.raises(ValueError, match="bench.workload=images: only with bench.mode=throughput"):
        build_config([f"model.path={llava_dir}", "task=bench", "bench=multimodal", "bench.baseline=hf"])
    with pytest.raises(ValueError, match="bench.image_size"):
        build_config([f"model.path={llava_dir}", "task=bench", "bench=multimodal", "bench.image_size=0"])
