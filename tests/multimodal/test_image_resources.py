"""What images leave behind in the process that serves them: 1,000 distinct images through
the engine client, in a process limited to 256 open files, leave its descriptor count flat
(pixel data crosses to the engine process as bytes in the message, not as shared memory
held open by an fd); and after a large image under the pixel cap (6000 x 6000), the
process's resident memory returns to where it was."""

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
from minivllm.multimodal.media import decode_image
from tests.multimodal.llava_checkpoint import random_image
from tests.multimodal.media_server import bomb_png
from tests.serve.harness import engine_config

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

def main(model_dir, images):
    engine = AsyncLLM(engine_config(model_dir))
    counts, rss = [], []

    async def one(name, image):
        prompt = {"prompt": "USER: <image>\nWhat? ASSISTANT:", "multi_modal_data": {"image": image}}
        async for _ in engine.generate(prompt, SamplingParams(max_tokens=1), name):
            pass

    async def run():
        for i in range(images):
            await one(f"img-{i}", random_image(i, 12))
            if i in (9, images // 2, images - 1):
                counts.append(len(os.listdir("/proc/self/fd")))
        large = bomb_png(6000, 6000)
        rss.append(rss_mb())
        for i in range(3):
            await one(f"large-{i}", decode_image(large, "image_url").convert("RGB"))
        rss.append(rss_mb())

    try:
        asyncio.run(run())
    finally:
        engine.shutdown()
    print(json.dumps({"fds": counts, "rss_mb": rss}))

if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
"""


def _limit_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_images_leave_no_descriptors_and_their_memory_returns(llava_dir, tmp_path):
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
    print(done.stdout.strip().splitlines()[-1])
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    after_10, halfway, at_the_end = seen["fds"]
    assert at_the_end <= after_10 + 2 and halfway <= after_10 + 2, seen
    before, after = seen["rss_mb"]
    assert after < before + 64, seen  # one 6000 x 6000 RGB image alone is 103 MB
