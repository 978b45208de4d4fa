"""tune.objective: each trial process claims its own device, and keeps it."""

from __future__ import annotations

import multiprocessing as mp
import os

from minivllm.tune import objective


def _claim(lock_dir, results, release):
    try:
        index = objective.claim_device(2, lock_dir)
        again = objective.claim_device(2, lock_dir)  # a later trial in the same process: the same device
        results.put((index, again, os.environ["CUDA_VISIBLE_DEVICES"]))
    except RuntimeError as err:
        results.put(str(err))
    release.wait(30)


def test_worker_processes_claim_distinct_devices(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    ctx = mp.get_context("fork")
    results, release = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_claim, args=(tmp_path, results, release)) for _ in range(3)]
    got = []
    for p in procs:  # one at a time, so the third finds both devices held
        p.start()
        got.append(results.get(timeout=30))
    release.set()
    for p in procs:
        p.join(10)
    assert sorted(got[:2]) == [(0, 0, "5"), (1, 1, "7")]  # the index into CUDA_VISIBLE_DEVICES, then narrowed to it
    assert "every device is taken" in got[2]
