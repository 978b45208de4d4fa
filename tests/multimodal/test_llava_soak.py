"""The soak with images: plain traffic beside chat requests that each carry a new image
(data URLs, and http URLs fetched from a loopback media server allowed by name), an
inward URL and a pixel bomb refused, for ~40 s; the API and engine processes' RSS and
descriptors must stay flat after warm-up, and no request may go wrong."""

from __future__ import annotations

import asyncio
import os

import pytest

from minivllm.bench.soak import SoakConfig, run_soak
from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.vllm_config import VllmConfig
from tests.multimodal.media_server import MediaServer
from tests.serve.harness import ENGINE_KWARGS, EngineHarness

pytestmark = pytest.mark.slow  # an engine process of its own, and 40 s of traffic


def test_soak_with_images(llava_dir):
    # a small processor cache: it fills during warm-up, so growth after it would be a leak
    kwargs = {**ENGINE_KWARGS, "mm_processor_cache_gb": 0.02}
    harness = EngineHarness(VllmConfig.from_dictconfig(config_from_kwargs(str(llava_dir), **kwargs)))
    try:
        with MediaServer() as media:
            server = harness.start_server(allowed_media_domains=["127.0.0.1"])
            try:
                pids = {"api_server": os.getpid(), "engine": harness.engine.engine_pid}
                cfg = SoakConfig(
                    duration_s=40,
                    concurrency=4,
                    warmup_frac=0.3,
                    seed=2,
                    constrained=False,
                    images=True,
                    media_url=media.base,
                )
                report = asyncio.run(run_soak(server.base_url, cfg, pids))
            finally:
                server.stop()
    finally:
        harness.close()
    print(report.summary())
    assert not report.problems(), report.summary()
    assert report.outcomes["unexpected"] == 0
    for kind in ("image_data", "image_http", "image_inward", "image_bomb", "completion", "chat"):
        assert report.requests[kind] > 0, kind
    assert report.requests["image_data"] + report.requests["image_http"] > 100
