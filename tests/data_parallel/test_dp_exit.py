"""A script that raises while an ``LLM(data_parallel_size=2)`` is alive exits like one
at dp=1: with the error, a non-zero code, promptly, and no engine process left behind.

The engine processes are not daemons and ignore SIGTERM; the traceback (and the
script's globals) keep the LLM alive until after multiprocessing's exit hook, which
joins non-daemon children. Unless the engines are told to stop first, that join
waits forever on engines that wait for commands."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.executor import tp_helpers as h

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TAG_KEY = "MINIVLLM_TEST_RUN"
READY = "dp=2 LLM ready"
SCRIPT = f"""
import sys

from minivllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(model=sys.argv[1], dtype="float32", block_size=8, num_gpu_blocks_override=32, max_model_len=32,
              data_parallel_size=2, disable_log_stats=True)
    print({READY!r}, file=sys.stderr, flush=True)
    llm.generate("x = x + 1\\n" * 20, SamplingParams(max_tokens=4), use_tqdm=False)  # over max_model_len
"""
EXIT_WITHIN_S = 60


@pytest.mark.timeout(420)
def test_a_script_raising_with_a_dp2_llm_alive_exits_promptly(llama_dir, tmp_path):
    script = tmp_path / "raises.py"
    script.write_text(SCRIPT)
    tag = uuid.uuid4().hex
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        TAG_KEY: tag,
    }
    proc = subprocess.Popen([sys.executable, str(script), str(llama_dir)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        head = []
        for line in proc.stderr:  # start-up takes a while on a shared CPU; it is not what is timed
            head.append(line)
            if READY in line:
                break
        assert any(READY in line for line in head), "".join(head)[-3000:]
        raised = time.monotonic()
        try:
            _, tail = proc.communicate(timeout=EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the script did not exit within {EXIT_WITHIN_S}s of raising")
        assert proc.returncode not in (0, None)
        assert "ValueError: prompt:" in tail and "max_model_len=32" in tail, tail[-3000:]
        assert time.monotonic() - raised < EXIT_WITHIN_S
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert h.wait_until(lambda: not h.pids_with_env(TAG_KEY, tag, with_tracker=False), timeout=10)
