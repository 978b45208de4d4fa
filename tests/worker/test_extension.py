"""parallel.worker_extension_cls: the extension's methods reach every worker by name through
LLM.collective_rpc (uni here, external launcher at world size 1; mp in test_weight_update.py,
Ray in tests/executor/test_ray_executor.py), and a bad extension fails before any worker starts."""

from __future__ import annotations

import os

import pytest

from minivllm import LLM
from tests.executor import tp_helpers as h

EXT = "tests.worker.extensions.RankInfo"


def test_uni_worker_gains_the_methods(llama_dir):
    llm = LLM(model=str(llama_dir), worker_extension_cls=EXT, **h.LLM_KWARGS)
    try:
        assert llm.collective_rpc("rank_and_pid") == [(0, os.getpid())]
        norm = llm.apply_model(lambda model: float(model.model.norm.weight.sum()))
        assert llm.collective_rpc("norm_weight_sum") == norm  # self.model_runner.model is the live model
        worker = llm.llm_engine.core.executor.worker
        assert type(worker).__mro__[1].__name__ == "Worker"
        h.generate(llm)  # the worker still works
    finally:
        llm.shutdown()


def test_external_launcher_worker_gains_the_methods(llama_dir, monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}.items():
        monkeypatch.setenv(key, value)
    llm = LLM(
        model=str(llama_dir), distributed_executor_backend="external_launcher", worker_extension_cls=EXT, **h.LLM_KWARGS
    )
    try:
        assert llm.collective_rpc("rank_and_pid") == [(0, os.getpid())]
    finally:
        llm.shutdown()


@pytest.mark.parametrize(
    "name, message",
    [
        ("tests.worker.no_such_module.X", r"cannot import 'tests.worker.no_such_module'"),
        ("tests.worker.extensions.Missing", r"'tests.worker.extensions' has no class 'Missing'"),
        ("tests.worker.extensions.not_a_class", r"has no class 'not_a_class'"),
        ("tests.worker.extensions.Clashing", r"defines execute_model, sleep, which Worker already has"),
        ("RankInfo", r"must be a qualified class name"),
        ("tests.worker.extensions:", r"must be a qualified class name"),
    ],
)
def test_bad_extension_is_refused_before_workers_start(llama_dir, name, message):
    before = h.child_pids()
    with pytest.raises(ValueError, match=rf"parallel.worker_extension_cls=.*{message}"):
        LLM(model=str(llama_dir), worker_extension_cls=name, tensor_parallel_size=2, **h.LLM_KWARGS)
    assert not h.child_pids() - before  # refused in this process: no worker was spawned


def test_colon_form_and_unknown_method(llama_dir):
    llm = LLM(model=str(llama_dir), worker_extension_cls="tests.worker.extensions:RankInfo", **h.LLM_KWARGS)
    try:
        assert llm.collective_rpc("rank_and_pid")[0][0] == 0
        with pytest.raises(RuntimeError, match="has no attribute 'no_such_method'"):
            llm.collective_rpc("no_such_method")
    finally:
        llm.shutdown()
