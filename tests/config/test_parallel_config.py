"""parallel.*: the executor follows tp and backend; shapes that cannot be split fail early."""

from __future__ import annotations

import sys

import pytest

from minivllm.config.store import build_config
from minivllm.executor import ray_cluster
from tests.model_configs import llama_config


def _cfg(ckpt, *overrides):
    return build_config([f"model.path={ckpt}", "model.dtype=float32", *overrides])


@pytest.mark.parametrize(
    "overrides, target",
    [
        ([], "minivllm.executor.base.UniProcExecutor"),
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
        ray_cluster.import_ray()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["parallel.dp=2", "parallel.dp_backend=foo"], r"parallel.dp_backend='foo': must be one of mp, ray"),
        (
            ["parallel.backend=ray", "parallel.placement_strategy=pack"],
            r"parallel.placement_strategy='pack': must be one of PACK, SPREAD, STRICT_PACK, STRICT_SPREAD",
        ),
        (["parallel.backend=ray", "parallel.placement_timeout_s=0"], r"parallel.placement_timeout_s=0.0: must be > 0"),
        (["parallel.dp_backend=ray"], r"parallel.dp_backend=ray: only applies with parallel.dp > 1"),
        (
            ["parallel.tp=2", "parallel.placement_strategy=STRICT_SPREAD"],
            r"parallel.placement_strategy=STRICT_SPREAD: only applies with parallel.backend=ray or parallel.dp_backend",
        ),
    ],
)
def test_bad_ray_fields_name_the_key_and_the_choices(llama_dir, overrides, message):
    with pytest.raises(ValueError, match=message):
        _cfg(llama_dir, *overrides)


def test_vllm_data_parallel_backend_keyword_maps_onto_dp_backend():
    from minivllm.config.llm_kwargs import config_from_kwargs

    cfg = config_from_kwargs(data_parallel_size=2, data_parallel_backend="ray")
    assert (cfg.parallel.dp, cfg.parallel.dp_backend) == (2, "ray")


CPU1 = {"CPU": 1.0}


@pytest.mark.parametrize(
    "count, strategy, nodes, problem",
    [
        (2, "PACK", [{"CPU": 1.0}, {"CPU": 1.0}], None),
        (3, "PACK", [{"CPU": 1.0}, {"CPU": 1.0}], "all nodes together fit 2"),
        (
            2,
            "STRICT_PACK",
            [{"CPU": 1.0}, {"CPU": 1.0}],
            "STRICT_PACK puts every bundle on one node, and the largest fits 1",
        ),
        (2, "STRICT_PACK", [{"CPU": 2.5}], None),
        (
            2,
            "STRICT_SPREAD",
            [{"CPU": 4.0}],
            "STRICT_SPREAD puts each bundle on its own node, and only 1 node(s) fit one",
        ),
        (2, "STRICT_SPREAD", [{"CPU": 1.0}, {"GPU": 1.0}, {"CPU": 1.0}], None),
        (1, "SPREAD", [{"GPU": 8.0}], "all nodes together fit 0"),
    ],
)
def test_placement_feasibility_is_checked_against_each_nodes_totals(count, strategy, nodes, problem):
    assert ray_cluster.why_infeasible(CPU1, count, strategy, nodes) == problem
