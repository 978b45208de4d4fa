"""RayDistributedExecutor on a local Ray instance: tp=2 and pp=2 actors give one rank's
tokens, and a dead actor fails the engine fast. Skipped only where Ray is not installed.
Several nodes (opt tp=2 and pp=2 across two, placement, a lost node): tests/ray/."""

from __future__ import annotations

import gc
import os
import signal
import time

import pytest

from minivllm import LLM
from tests.executor import tp_helpers as h

ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'minivllm[ray]'); CI installs it")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One small local Ray instance for the module; shutting it down must leave no process."""
    before = h.child_pids()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    gc.collect()
    ray.shutdown()
    assert h.wait_until(lambda: not (h.child_pids() - before), timeout=15), h.child_pids() - before


def _ray_llm(ckpt, **kwargs) -> LLM:
    return LLM(model=str(ckpt), tensor_parallel_size=2, distributed_executor_backend="ray", **h.LLM_KWARGS, **kwargs)


@pytest.mark.timeout(180)
def test_llama_tp2_on_ray_matches_tp1(llama_dir):
    # holds both CPUs of the instance: one engine at a time
    llm = _ray_llm(llama_dir, worker_extension_cls="tests.worker.extensions.RankInfo")
    try:
        h.assert_same_outputs(h.reference(llama_dir), h.generate(llm))
        caches = llm.llm_engine.core.executor.collective_rpc(h.kv_cache_shape)
        assert [c[3] for c in caches] == [1, 1]  # the 2 KV heads split over the ranks
        offset = 7  # a user's closure reaches the actors (LLM.collective_rpc, LLM.apply_model)
        results = llm.collective_rpc(lambda worker: (worker.rank + offset, os.getpid()))
        pids = llm.llm_engine.core.executor.worker_pids
        assert results == [(7, pids[0]), (8, pids[1])]
        assert llm.collective_rpc("rank_and_pid") == [(0, pids[0]), (1, pids[1])]  # the worker extension's
        up = llm.apply_model(lambda model: tuple(model.model.layers[0].mlp.gate_up_proj.weight.shape))
        assert up == [(128, 64), (128, 64)]  # gate and up, 64 of 128 rows each per rank
    finally:
        llm.shutdown()


@pytest.mark.timeout(240)
def test_opt_pp2_on_ray_matches_pp1_and_a_killed_actor_fails_fast(opt_dir):
    """One engine for both (each costs a set of actors): the kill comes after the outputs."""
    llm = LLM(model=str(opt_dir), pipeline_parallel_size=2, distributed_executor_backend="ray", **h.LLM_KWARGS)
    try:
        h.assert_same_outputs(h.reference(opt_dir), h.generate(llm))
        assert llm.collective_rpc(lambda worker: len(worker.model_runner.kv_caches)) == [1, 1]  # a layer per stage
        pids = llm.llm_engine.core.executor.worker_pids
        os.kill(pids[1], signal.SIGKILL)  # the last stage
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"worker rank 1 died"):
            h.generate(llm)
        assert time.monotonic() - start < 15
        assert h.wait_until(lambda: not any(h.alive(p) for p in pids), timeout=10)
    finally:
        llm.shutdown()
