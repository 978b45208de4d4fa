"""parallel.*: the executor follows tp and backend; shapes that cannot be split fail early."""

from __future__ import annotations

import sys

import pytest

from minivllm.config.store import build_config
from minivllm.executor import ray_executor
from tests.model_configs import llama_config


def _cfg(ckpt, *overrides):
    return build_config([f"model.path={ckpt}", "model.dtype=float32", *overrides])


@pytest.mark.parametrize(
    "overrides, target",
    [
        ([], "minivllm.executor.uniproc.UniProcExecutor"),
        (["parallel.tp=2"], "minivllm.executor.multiproc.MultiprocExecutor"),
        (["parallel.tp=2", "parallel.backend=ray"], "minivllm.executor.ray_executor.RayDistributedExecutor"),
        (["parallel.backend=mp"], "minivllm.executor.multiproc.MultiprocExecutor"),
    ],
)
def test_executor_follows_tp_and_backend(llama_dir, overrides, target):
    cfg = _cfg(llama_dir, *overrides)
    assert cfg.parallel.executor["_target_"] == target
    assert cfg.to_dictconfig().parallel.executor._target_ == target  # what resolved_config.yaml shows


def test_uni_backend_with_two_ranks_is_rejected(llama_dir):
    with pytest.raises(ValueError, match="parallel.backend=uni"):
        _cfg(llama_dir, "parallel.tp=2", "parallel.backend=uni")


def test_tp_must_divide_the_attention_heads(llama_dir):
    with pytest.raises(ValueError, match=r"parallel.tp=3: the model's num_attention_heads=4"):
        _cfg(llama_dir, "parallel.tp=3")


def test_kv_heads_must_divide_or_be_divided_by_tp(make_checkpoint):
    ckpt = make_checkpoint("llama-h8-kv2", llama_config(num_attention_heads=8, num_key_value_heads=2, hidden_size=64))
    assert _cfg(ckpt, "parallel.tp=4").parallel.tp == 4  # 2 KV heads, each on 2 ranks
    odd = make_checkpoint("llama-h12-kv3", llama_config(num_attention_heads=12, num_key_value_heads=3, hidden_size=96))
    with pytest.raises(ValueError, match=r"parallel.tp=2: the model's num_key_value_heads=3"):
        _cfg(odd, "parallel.tp=2")


def test_mlp_width_must_divide(make_checkpoint):
    ckpt = make_checkpoint("llama-mlp-100", llama_config(intermediate_size=102))
    with pytest.raises(ValueError, match=r"parallel.tp=4: the model's intermediate_size=102"):
        _cfg(ckpt, "parallel.tp=4")


def test_ray_backend_without_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ValueError, match=r"parallel.backend=ray: Ray is not installed; pip install 'minivllm\[ray\]'"):
        ray_executor._import_ray()
