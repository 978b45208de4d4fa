"""load.format=sharded_state: a tp=2 engine saves one set of files per rank, and each rank
loads back exactly its own parameters; at tp=1 the round trip generates what safetensors does.

(One tp=2 engine serves the tp=2 checks: its workers load the saved shards with
ShardedStateLoader and compare them with the parameters they serve, which
test_multiproc shows give tp=1's tokens.)"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from minivllm import LLM
from minivllm.model_loader.sharded_state import ShardedStateLoader, save_sharded_state
from tests.executor import tp_helpers as h
from tools.save_sharded_state import main as save_main

pytestmark = pytest.mark.slow
QKV = "model.layers.0.self_attn.qkv_proj.weight"


@pytest.fixture(scope="module")
def llama_tp2(llama_dir):
    llm = LLM(model=str(llama_dir), tensor_parallel_size=2, **h.LLM_KWARGS)
    yield llm
    llm.shutdown()


def load_shard_and_compare(worker, sharded_dir: str) -> int:
    """Runs in each worker: load this rank's files as a fresh model; every parameter must equal
    the one the worker serves. Returns how many parameters were compared."""
    import copy
    from pathlib import Path

    cfg = copy.copy(worker.cfg)  # the live config stays as it is
    cfg.checkpoint_dir = Path(sharded_dir)
    loaded = ShardedStateLoader().load_model(cfg, worker.model_runner.attn_backend, worker.device)
    live = dict(worker.model_runner.model.named_parameters())
    for name, param in loaded.named_parameters():
        assert torch.equal(param, live[name]), name
    return len(live)


def test_tp2_ranks_save_and_load_only_their_own_shards(llama_tp2, llama_dir, tmp_path):
    files = save_sharded_state(llama_tp2, tmp_path)
    assert files == [["model-rank-0-part-0.safetensors"], ["model-rank-1-part-0.safetensors"]]
    assert (tmp_path / "config.json").is_file() and (tmp_path / "tokenizer.json").is_file()
    with safe_open(str(llama_dir / "model.safetensors"), framework="pt") as f:
        rows = sum(f.get_slice(f"model.layers.0.self_attn.{p}_proj.weight").get_shape()[0] for p in "qkv")
    for rank in (0, 1):
        with safe_open(str(tmp_path / f"model-rank-{rank}-part-0.safetensors"), framework="pt") as f:
            assert f.get_slice(QKV).get_shape()[0] == rows // 2
    counts = llama_tp2.llm_engine.core.executor.collective_rpc(load_shard_and_compare, (str(tmp_path),))
    assert counts[0] == counts[1] > 0
    with pytest.raises(ValueError, match="parallel.tp=2"):  # saved at 2 ranks: refused at 1
        LLM(model=str(tmp_path), load_format="sharded_state", **h.LLM_KWARGS)


def test_tool_round_trip_at_tp1_equals_safetensors(llama_dir, tmp_path):
    save_main([str(llama_dir), str(tmp_path), "--dtype", "float32"])
    llm = LLM(model=str(tmp_path), load_format="sharded_state", **h.LLM_KWARGS)
    h.assert_same_outputs(h.reference(llama_dir), h.generate(llm), atol=0.0)


def test_kv_cache_scales_survive_the_round_trip(llama_dir, tmp_path):
    llm = LLM(model=str(llama_dir), kv_cache_dtype="fp8", **h.LLM_KWARGS)
    attn = llm.llm_engine.core.executor.worker.model_runner.model.model.layers[1].self_attn.attn
    attn.k_scale, attn.v_scale = 0.5, 0.25
    save_sharded_state(llm, tmp_path)
    loaded = LLM(model=str(tmp_path), kv_cache_dtype="fp8", load_format="sharded_state", **h.LLM_KWARGS)
    layers = loaded.llm_engine.core.executor.worker.model_runner.model.model.layers
    assert [(l.self_attn.attn.k_scale, l.self_attn.attn.v_scale) for l in layers] == [(1.0, 1.0), (0.5, 0.25)]
