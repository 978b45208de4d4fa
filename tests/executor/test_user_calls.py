"""LLM.collective_rpc and LLM.apply_model under the uni executor: a user's lambda or
closure runs in this process. The mp ranks are in test_multiproc.py (on its tp=2
engine), Ray's in test_ray_executor.py."""

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


def test_bad_arguments_are_refused(opt_tp1):
    with pytest.raises(ValueError, match=r"collective_rpc: method=3 must be"):
        opt_tp1.collective_rpc(3)
    with pytest.raises(ValueError, match=r"collective_rpc: timeout=1.0 is not supported"):
        opt_tp1.collective_rpc("get_model", 1.0)
    with pytest.raises(ValueError, match=r"collective_rpc: args=5 must be a tuple"):
        opt_tp1.collective_rpc("get_model", args=5)
