"""No descriptor per image: 1,000 distinct images through the engine client, in a process
limited to 256 open files, leave its descriptor count flat (pixel data crosses to the
engine process as bytes in the message, not as shared memory held open by an fd)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # an engine process of its own

IMAGES = 1000
FD_LIMIT = 256

RUN = r"""
import asyncio, json, os, sys
from minivllm import SamplingParams
from minivllm.engine.async_llm import AsyncLLM
from tests.multimodal.llava_checkpoint import random_image
from tests.serve.harness import engine_config

def main(model_dir, images):
    engine = AsyncLLM(engine_config(model_dir))
    counts = []

    async def run():
        for i in range(images):
            prompt = {"prompt": "USER: <image>\nWhat? ASSISTANT:", "multi_modal_data": {"image": random_image(i, 12)}}
            async for _ in engine.generate(prompt, SamplingParams(max_tokens=1), f"img-{i}"):
                pass
            if i in (9, images // 2, images - 1):
                counts.append(len(os.listdir("/proc/self/fd")))

    try:
        asyncio.run(run())
    finally:
        engine.shutdown()
    print(json.dumps(counts))

if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
"""


def _limit_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_a_thousand_distinct_images_leave_the_descriptor_count_flat(llava_dir, tmp_path):
    script = tmp_path / "run_images.py"
    script.write_text(RUN)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    done = subprocess.run(
        [sys.executable, str(script), str(llava_dir), str(IMAGES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_descriptors,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    after_10, halfway, at_the_end = json.loads(done.stdout.strip().splitlines()[-1])
    assert at_the_end <= after_10 + 2 and halfway <= after_10 + 2, (after_10, halfway, at_the_end)
