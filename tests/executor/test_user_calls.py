"""LLM.collective_rpc and LLM.apply_model: a user's lambda or closure reaches every
rank (uni and mp here; Ray in test_ray_executor.py), one result per rank, and an
error on a rank comes back naming it while the engine keeps serving."""
from __future__ import annotations

import os

import pytest
import torch
from safetensors import safe_open

from minivllm import LLM
from tests.executor import tp_helpers as h

FC1 = "model.decoder.layers.0.fc1.weight"


@pytest.fixture(scope="module")
def opt_tp1(opt_dir):
    llm = LLM(model=str(opt_dir), **h.LLM_KWARGS)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def opt_tp2(opt_dir):
    llm = LLM(model=str(opt_dir), tensor_parallel_size=2, **h.LLM_KWARGS)
    yield llm
    llm.shutdown()


def _fc1(model: torch.nn.Module) -> torch.Tensor:
    return model.model.decoder.layers[0].fc1.weight


def _checkpoint_tensor(ckpt, name: str) -> torch.Tensor:
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        return f.get_tensor(name)


def test_uni_lambda_runs_in_this_process(opt_tp1):
    offset = 7  # a closure: the lambda captures it
    assert opt_tp1.collective_rpc(lambda worker: (worker.rank + offset, os.getpid())) == [(7, os.getpid())]


def test_uni_apply_model_sees_the_whole_weight(opt_dir, opt_tp1):
    shapes = opt_tp1.apply_model(lambda model: tuple(_fc1(model).shape))
    assert shapes == [tuple(_checkpoint_tensor(opt_dir, FC1).shape)]


def test_method_name(opt_tp1):
    assert opt_tp1.collective_rpc("get_model")[0] is opt_tp1.llm_engine.core.executor.worker.model_runner.model


@pytest.mark.slow
def test_mp_lambda_returns_one_result_per_rank(opt_tp2):
    offset = 100
    results = opt_tp2.collective_rpc(lambda worker, scale: (worker.rank * scale + offset, os.getpid()), args=(10,))
    assert [r[0] for r in results] == [100, 110]
    assert [r[1] for r in results] == opt_tp2.llm_engine.core.executor.worker_pids  # ran in the workers


@pytest.mark.slow
def test_mp_apply_model_reads_each_ranks_shard(opt_dir, opt_tp2):
    shards = opt_tp2.apply_model(lambda model: _fc1(model).detach().clone())
    full = _checkpoint_tensor(opt_dir, FC1)  # (ffn_dim=128, hidden=64), split by output rows
    assert [tuple(s.shape) for s in shards] == [(64, 64), (64, 64)]
    torch.testing.assert_close(torch.cat(shards), full, rtol=0, atol=0)


@pytest.mark.slow
def test_mp_error_names_the_rank_and_the_engine_keeps_serving(opt_dir, opt_tp2):
    def fails_on_rank_1(worker):
        if worker.rank == 1:
            raise KeyError("no such thing")
        return worker.rank

    with pytest.raises(RuntimeError, match=r"collective_rpc\(.*fails_on_rank_1\): worker rank 1 raised KeyError"):
        opt_tp2.collective_rpc(fails_on_rank_1)
    with pytest.raises(RuntimeError, match=r"worker rank 0 raised AttributeError.*\(ranks that raised: 0, 1\)"):
        opt_tp2.collective_rpc("no_such_method")
    h.assert_same_outputs(h.reference(opt_dir), h.generate(opt_tp2))


def test_bad_arguments_are_refused(opt_tp1):
    with pytest.raises(ValueError, match=r"collective_rpc: method=3 must be"):
        opt_tp1.collective_rpc(3)
    with pytest.raises(ValueError, match=r"collective_rpc: timeout=1.0 is not supported"):
        opt_tp1.collective_rpc("get_model", 1.0)
    with pytest.raises(ValueError, match=r"collective_rpc: args=5 must be a tuple"):
        opt_tp1.collective_rpc("get_model", args=5)
