"""How many intra-op threads a CPU worker runs: the key, then OMP_NUM_THREADS, then the affinity mask."""

from __future__ import annotations

import os
import platform

import pytest
import torch

from minivllm.config.device import DeviceConfig
from minivllm.distributed.utils import CPU_WORKER_ENV, available_cpus, cpu_threads, keep_freed_pages, spawn_env


@pytest.mark.parametrize(
    "requested, env, per_rank, expected",
    [
        (3, "5", 2, 3),  # the key wins over everything
        (None, "5", 2, 5),  # then the user's OMP_NUM_THREADS
        (None, None, 2, 2),  # then the executor's share among local ranks
        (None, "", None, None),  # an empty variable counts as unset: every core of the mask
        (None, None, None, None),
    ],
)
def test_the_explicit_setting_wins_then_the_affinity_mask(monkeypatch, requested, env, per_rank, expected):
    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
    assert cpu_threads(requested, per_rank) == (expected if expected is not None else len(os.sched_getaffinity(0)))


def test_zero_threads_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="device.cpu_threads"):
        DeviceConfig(type="cpu", cpu_threads=0)


def test_a_cpu_worker_sets_its_threads_once_at_start(llama_dir):
    from minivllm.config import VllmConfig
    from minivllm.worker.worker import Worker

    before = torch.get_num_threads()
    threads = 1 if available_cpus() > 1 else 2  # not what an unset key would give
    cfg = VllmConfig.from_dictconfig(
        {"model": {"path": str(llama_dir)}, "device": {"type": "cpu", "cpu_threads": threads}}
    )
    try:
        Worker(cfg).init_device()
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_spawned_cpu_processes_get_passive_openmp_threads_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with spawn_env("cpu"):
        assert os.environ["OMP_WAIT_POLICY"] == CPU_WORKER_ENV["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in os.environ  # this process's environment is left as it was
    with spawn_env("cuda"):
        assert "OMP_WAIT_POLICY" not in os.environ
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    with spawn_env("cpu"):
        assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_tp_ranks_on_the_cpu_run_with_passive_openmp_threads(llama_dir, monkeypatch):
    from minivllm import LLM

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    llm = LLM(model=str(llama_dir), dtype="float32", device="cpu", tensor_parallel_size=2, num_gpu_blocks_override=16)
    try:
        assert llm.collective_rpc(lambda worker: os.environ.get("OMP_WAIT_POLICY")) == ["PASSIVE", "PASSIVE"]
    finally:
        llm.shutdown()
    assert "OMP_WAIT_POLICY" not in os.environ


def test_cpu_workers_keep_freed_pages_unless_the_user_tuned_malloc(monkeypatch):
    if platform.libc_ver()[0] == "glibc":
        assert keep_freed_pages()  # every mallopt call accepted
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert not keep_freed_pages()  # the user's own setting is left alone
