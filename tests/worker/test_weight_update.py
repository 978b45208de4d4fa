"""In-place weight updates of a running engine (worker/weight_update.py): an engine started on
checkpoint A and updated to a perturbed copy B, by path or over a gloo group from a separate
trainer process, samples exactly what a fresh engine on B samples (greedy tokens and logprobs)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from minivllm import LLM
from tests.executor import tp_helpers as h
from tests.worker import rl_helpers as rl


@pytest.fixture(scope="module")
def ckpt_b(llama_dir, tmp_path_factory):
    return rl.perturbed_copy(llama_dir, tmp_path_factory.mktemp("rl") / "b")


@pytest.fixture(scope="module")
def outputs_b(ckpt_b):
    return h.reference(ckpt_b)


@pytest.fixture(scope="module")
def outputs_a(llama_dir):
    return h.reference(llama_dir)


def _tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def _engine(ckpt, **kwargs) -> LLM:
    return LLM(model=str(ckpt), worker_extension_cls=rl.EXTENSION, **{**h.LLM_KWARGS, **kwargs})


def _sync_over_gloo(llm: LLM, ckpt_b, num_ranks: int) -> None:
    """A trainer process broadcasts every tensor of B; each rank receives and loads it."""
    port, world = rl.free_port(), num_ranks + 1
    trainer = mp.get_context("spawn").Process(target=rl.trainer_main, args=(str(ckpt_b), port, world))
    trainer.start()
    try:
        llm.collective_rpc("init_weight_update_group", args=("127.0.0.1", port, 1, world))
        for name, tensor in rl.checkpoint_tensors(ckpt_b):
            llm.collective_rpc("update_weight", args=(name, str(tensor.dtype), tuple(tensor.shape)))
        llm.collective_rpc("close_weight_update_group")
    finally:
        trainer.join(timeout=60)
    assert trainer.exitcode == 0


def test_checkpoints_differ(outputs_a, outputs_b):
    assert _tokens(outputs_a) != _tokens(outputs_b)  # otherwise the tests below would prove nothing


def test_update_by_path_equals_fresh_engine(llama_dir, ckpt_b, outputs_a, outputs_b):
    llm = _engine(llama_dir)
    try:
        h.assert_same_outputs(outputs_a, h.generate(llm))  # also fills the prefix cache with A's KV
        assert llm.collective_rpc("update_weights_from_path", args=(str(ckpt_b),)) == [
            len(rl.checkpoint_tensors(ckpt_b))
        ]
        assert llm.reset_prefix_cache()
        h.assert_same_outputs(outputs_b, h.generate(llm))
    finally:
        llm.shutdown()


def test_update_over_gloo_from_a_trainer_process(llama_dir, ckpt_b, outputs_b):
    llm = _engine(llama_dir)
    try:
        h.generate(llm)
        _sync_over_gloo(llm, ckpt_b, num_ranks=1)
        assert llm.reset_prefix_cache()
        h.assert_same_outputs(outputs_b, h.generate(llm))
    finally:
        llm.shutdown()


@pytest.mark.slow
def test_both_ways_and_sleep_at_tp2(llama_dir, ckpt_b, outputs_a, outputs_b):
    """Under mp: B over gloo; then a level-2 sleep (each rank measures its own process) and A by path."""
    kwargs = dict(tensor_parallel_size=2, enable_sleep_mode=True, num_gpu_blocks_override=8192)
    llm = _engine(llama_dir, **kwargs)
    try:
        _sync_over_gloo(llm, ckpt_b, num_ranks=2)
        assert llm.reset_prefix_cache()
        h.assert_same_outputs(outputs_b, h.generate(llm))
        before = rl.memory(llm)
        llm.sleep(level=2)
        rl.assert_released(before, rl.memory(llm), weights=True)
        llm.wake_up(tags=["weights"])
        llm.collective_rpc("update_weights_from_path", args=(str(llama_dir),))  # and back to A
        llm.wake_up(tags=["kv_cache"])
        h.assert_same_outputs(outputs_a, h.generate(llm))
    finally:
        llm.shutdown()


def test_stale_prefix_cache_is_kept_until_reset(llama_dir, ckpt_b, outputs_a):
    """Without reset_prefix_cache the old KV is reused: the documented reason to call it."""
    llm = _engine(llama_dir)
    try:
        h.generate(llm)
        llm.collective_rpc("update_weights_from_path", args=(str(ckpt_b),))
        hits_before = llm.llm_engine.scheduler_stats().prefix_cache_hits
        h.generate(llm)
        assert llm.llm_engine.scheduler_stats().prefix_cache_hits > hits_before
    finally:
        llm.shutdown()


def test_reset_prefix_cache_refuses_while_requests_run(llama_dir, caplog):
    llm = _engine(llama_dir)
    try:
        req = llm.llm_engine.add_request(None, "def f(x):", h.GREEDY)
        llm.llm_engine.step()
        assert llm.reset_prefix_cache() is False
        assert "unfinished hold KV blocks" in caplog.text
        llm.llm_engine.abort_request(req)
        assert llm.reset_prefix_cache() is True
    finally:
        llm.shutdown()


def test_bad_updates_are_refused_and_the_engine_keeps_serving(llama_dir, tmp_path, outputs_a):
    llm = _engine(llama_dir)
    try:
        with pytest.raises(RuntimeError, match="neither a directory nor a file"):
            llm.collective_rpc("update_weights_from_path", args=(str(tmp_path / "missing"),))
        with pytest.raises(RuntimeError, match="call init_weight_update_group first"):
            llm.collective_rpc("update_weight", args=("model.norm.weight", "float32", (64,)))
        with pytest.raises(RuntimeError, match=r"dtype='int7' must be one of"):
            llm.collective_rpc("update_weight", args=("model.norm.weight", "int7", (64,)))
        h.assert_same_outputs(outputs_a, h.generate(llm))
    finally:
        llm.shutdown()
