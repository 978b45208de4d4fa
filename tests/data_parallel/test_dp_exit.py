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
import threading
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


STARTS_WITHIN_S = 300
"""Start-up (two engine processes importing torch) is slow on a shared 2-core machine; it is not what is timed."""


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
    lines: list[str] = []
    ready = threading.Event()

    def read_stderr() -> None:  # one reader for the whole stream: nothing is lost in a buffer
        for line in proc.stderr:
            lines.append(line)
            if READY in line:
                ready.set()
        ready.set()  # end of file: the script ended (or failed) before raising

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert ready.wait(STARTS_WITHIN_S) and any(READY in line for line in lines), "".join(lines)[-3000:]
        raised = time.monotonic()
        try:
            proc.wait(timeout=EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the script did not exit within {EXIT_WITHIN_S}s of raising")
        assert time.monotonic() - raised < EXIT_WITHIN_S
        reader.join(10)
        text = "".join(lines)
        assert proc.returncode != 0
        assert "ContextLengthExceeded: The decoder prompt" in text, text[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert h.wait_until(lambda: not h.pids_with_env(TAG_KEY, tag, with_tracker=False), timeout=10)
