"""The short soak: ~40 s of mixed traffic with faults against a live server; every
well-formed request completes or is reported failed (503), no 500, the engine ends
idle, and memory and file descriptors are flat after warm-up.
(``benchmarks/soak.py`` runs the same for 10 minutes.)"""

from __future__ import annotations

import asyncio
import os

from minivllm.bench.soak import SoakConfig, run_soak

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def test_short_soak(async_engine):
    server = async_engine.start_server(chat_template=TEMPLATE)
    try:
        pids = {"api_server": os.getpid(), "engine": async_engine.engine.engine_pid}
        cfg = SoakConfig(duration_s=40, concurrency=6, warmup_frac=0.25, seed=1)
        report = asyncio.run(run_soak(server.base_url, cfg, pids))
    finally:
        server.stop()
    print(report.summary())
    assert not report.problems(), report.summary()
    assert report.outcomes["ok"] > 20 and report.outcomes["disconnected"] > 0 and report.outcomes["refused"] > 0
    assert report.outcomes["unexpected"] == 0
