"""MultiprocExecutor: tp=2 in worker processes gives tp=1's tokens, each rank holding its
shard; a user's lambda (LLM.collective_rpc, LLM.apply_model) reaches every rank, and an
error on a rank comes back naming it while the engine keeps serving."""

from __future__ import annotations

import os
import weakref

import pytest
import torch
from safetensors import safe_open

from minivllm import LLM
from minivllm.distributed.utils import cpu_threads, threads_per_rank
from minivllm.executor.multiproc import MultiprocExecutor
from tests.executor import tp_helpers as h
from tests.model_configs import llama_config, olmo2_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def opt_tp2(opt_dir):
    """Tests get a weak proxy, so the fixture holds the only reference: dropping it at
    teardown, with no shutdown() call, must stop the workers (no_leftover_children checks)."""
    llm = LLM(model=str(opt_dir), tensor_parallel_size=2, **h.LLM_KWARGS)
    yield weakref.proxy(llm)
    del llm


@pytest.fixture(scope="module")
def llama_kv1_dir(make_checkpoint):
    return make_checkpoint("llama-kv1", llama_config(num_key_value_heads=1))


@pytest.fixture(scope="module")
def llama_kv1_tp2(llama_kv1_dir):
    llm = LLM(model=str(llama_kv1_dir), tensor_parallel_size=2, **h.LLM_KWARGS)
    yield llm
    llm.shutdown()


FC1 = "model.decoder.layers.0.fc1.weight"


def _fc1(model: torch.nn.Module) -> torch.Tensor:
    return model.model.decoder.layers[0].fc1.weight


def _checkpoint_tensor(ckpt, name: str) -> torch.Tensor:
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        return f.get_tensor(name)


def _executor(llm: LLM) -> MultiprocExecutor:
    return llm.llm_engine.core.executor


def test_tp2_alone_selects_the_multiproc_executor(opt_tp2):
    executor = _executor(opt_tp2)
    assert type(executor) is MultiprocExecutor
    assert opt_tp2.cfg.parallel.executor["_target_"] == "minivllm.executor.multiproc.MultiprocExecutor"
    assert len(executor.worker_pids) == 2 and os.getpid() not in executor.worker_pids


def test_opt_tp2_matches_tp1(opt_dir, opt_tp2):
    h.assert_same_outputs(h.reference(opt_dir), h.generate(opt_tp2))


def test_tp2_with_async_scheduling_matches_tp1(opt_dir):
    """The mp executor's execute_model_async returns before the ranks finish, so the engine
    schedules step k+1 while they run step k; the tokens must not change."""
    llm = LLM(model=str(opt_dir), tensor_parallel_size=2, async_scheduling=True, **h.LLM_KWARGS)
    try:
        assert llm.cfg.async_scheduling and llm.cfg.world_size == 2
        h.assert_same_outputs(h.reference(opt_dir), h.generate(llm))
    finally:
        llm.shutdown()


def test_llama_with_fewer_kv_heads_than_ranks_matches_tp1(llama_kv1_dir, llama_kv1_tp2):
    h.assert_same_outputs(h.reference(llama_kv1_dir), h.generate(llama_kv1_tp2))


def test_olmo2_norms_over_all_heads_match_tp1(make_checkpoint):
    """OLMo 2's q/k RMSNorms span every head, so each rank adds the other's squares;
    with one KV head on two ranks, k's statistics come from a replicated shard."""
    ckpt = make_checkpoint("olmo2-kv1", olmo2_config(num_key_value_heads=1))
    llm = LLM(model=str(ckpt), tensor_parallel_size=2, **h.LLM_KWARGS)
    try:
        h.assert_same_outputs(h.reference(ckpt), h.generate(llm))
    finally:
        llm.shutdown()


def test_each_rank_holds_only_its_shard_of_the_weights(opt_dir, opt_tp2):
    shapes = _executor(opt_tp2).collective_rpc(h.param_shapes)
    full = {}
    with safe_open(str(opt_dir / "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            full[name] = tuple(f.get_slice(name).get_shape())
    layer = "model.decoder.layers.0."
    for rank_shapes in shapes:
        assert rank_shapes[layer + "self_attn.qkv_proj.weight"] == (3 * 64 // 2, 64)  # q, k, v: 2 of 4 heads each
        assert rank_shapes[layer + "fc1.weight"] == (128 // 2, 64)  # column-parallel: output rows split
        assert rank_shapes[layer + "fc2.weight"] == (64, 128 // 2)  # row-parallel: input columns split
        assert rank_shapes[layer + "fc2.bias"] == full[layer + "fc2.bias"]  # added once after the reduction: whole
        assert rank_shapes["model.decoder.embed_tokens.weight"] == (512 // 2, 64)  # vocabulary split
    total = sum(torch.Size(s).numel() for s in full.values())
    for rank_shapes in shapes:
        assert sum(torch.Size(s).numel() for s in rank_shapes.values()) < 0.6 * total


def test_shards_are_the_checkpoint_slices(opt_dir, opt_tp2):
    name = "model.decoder.layers.1.fc2.weight"
    parts = _executor(opt_tp2).collective_rpc(h.param_values, (name,))
    with safe_open(str(opt_dir / "model.safetensors"), framework="pt") as f:
        full = f.get_tensor(name)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=0)


def test_kv_heads_are_replicated_when_tp_exceeds_them(llama_kv1_tp2):
    executor = _executor(llama_kv1_tp2)
    caches = executor.collective_rpc(h.kv_cache_shape)
    assert [c[3] for c in caches] == [1, 1]  # (2, blocks, block_size, kv_heads, head_dim): one KV head each
    qkv = executor.collective_rpc(h.param_values, ("model.layers.0.self_attn.qkv_proj.weight",))
    q_rows, kv_rows = 2 * 16, 16  # 2 of 4 query heads, the one KV head (head_dim 16)
    assert all(part.shape == (q_rows + 2 * kv_rows, 64) for part in qkv)
    torch.testing.assert_close(qkv[0][q_rows:], qkv[1][q_rows:], rtol=0, atol=0)  # same k and v on both
    assert not torch.equal(qkv[0][:q_rows], qkv[1][:q_rows])  # different query heads


def test_ranks_share_the_cores(opt_tp2):
    assert _executor(opt_tp2).collective_rpc(h.num_threads) == [cpu_threads(None, threads_per_rank(2))] * 2


def test_mp_lambda_returns_one_result_per_rank(opt_tp2):
    offset = 100
    results = opt_tp2.collective_rpc(lambda worker, scale: (worker.rank * scale + offset, os.getpid()), args=(10,))
    assert [r[0] for r in results] == [100, 110]
    assert [r[1] for r in results] == opt_tp2.llm_engine.core.executor.worker_pids  # ran in the workers


def test_mp_apply_model_reads_each_ranks_shard(opt_dir, opt_tp2):
    shards = opt_tp2.apply_model(lambda model: _fc1(model).detach().clone())
    full = _checkpoint_tensor(opt_dir, FC1)  # (ffn_dim=128, hidden=64), split by output rows
    assert [tuple(s.shape) for s in shards] == [(64, 64), (64, 64)]
    torch.testing.assert_close(torch.cat(shards), full, rtol=0, atol=0)


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
