"""Sleep mode (worker/sleep.py; at tp=2 in test_weight_update.py): the KV cache and the weights give their memory back, measured in
the worker's own process (its resident set, and the bytes its tensors hold), and the engine
samples exactly what it sampled before sleeping once it wakes."""

from __future__ import annotations

import pytest

from minivllm import LLM
from tests.executor import tp_helpers as h
from tests.worker import rl_helpers as rl

BIG_KV = dict(h.LLM_KWARGS, num_gpu_blocks_override=8192)  # 2 layers x 16 MiB of KV: well above RSS noise


def _engine(ckpt, **kwargs) -> LLM:
    kw = dict(BIG_KV, enable_sleep_mode=True, worker_extension_cls=rl.EXTENSION)
    return LLM(model=str(ckpt), **{**kw, **kwargs})


@pytest.fixture(scope="module", params=["false", "true"], ids=["plain", "packed"])
def sleepy(llama_dir, request):
    """Also with every linear layer packed for oneDNN (device.cpu_packed_linear=true): level 2 drops the
    packed copies with the weights and the reload packs them again."""
    llm = _engine(llama_dir, overrides=[f"device.cpu_packed_linear={request.param}"])
    yield llm
    llm.shutdown()


def test_level1_round_trip(sleepy):
    expected = h.generate(sleepy)
    before = rl.memory(sleepy)
    sleepy.sleep(level=1)
    assert sleepy.llm_engine.is_sleeping()
    rl.assert_released(before, rl.memory(sleepy), weights=False)  # CPU: the weights are host memory already
    sleepy.wake_up()
    assert not sleepy.llm_engine.is_sleeping()
    assert rl.memory(sleepy)[0]["kv_bytes"] == before[0]["kv_bytes"]
    h.assert_same_outputs(expected, h.generate(sleepy))


def test_level2_round_trip_reloads_weights(sleepy, llama_dir):
    expected = h.generate(sleepy)
    before = rl.memory(sleepy)
    sleepy.sleep(level=2)
    rl.assert_released(before, rl.memory(sleepy), weights=True)
    with pytest.raises(RuntimeError, match=r"the weights are asleep; call wake_up\(tags=\['weights'\]\) first"):
        sleepy.collective_rpc("update_weights_from_path", args=(str(llama_dir),))
    sleepy.wake_up(tags=["weights"])  # uninitialised until the caller loads them
    assert sleepy.llm_engine.is_sleeping()  # the KV cache still sleeps
    sleepy.apply_model(lambda model: [p.data.zero_() for p in model.parameters()] and None)  # whatever was there
    sleepy.collective_rpc("update_weights_from_path", args=(str(llama_dir),))
    sleepy.wake_up(tags=["kv_cache"])
    assert not sleepy.llm_engine.is_sleeping()
    h.assert_same_outputs(expected, h.generate(sleepy))


def test_generating_while_asleep_is_refused(sleepy):
    sleepy.sleep(level=1)
    try:
        with pytest.raises(ValueError, match="the engine is sleeping"):
            h.generate(sleepy)
        assert not sleepy.llm_engine.has_unfinished_requests()
        with pytest.raises(ValueError, match="already asleep"):
            sleepy.sleep(level=1)
    finally:
        sleepy.wake_up()
    h.generate(sleepy)


def test_bad_sleep_calls(sleepy, llama_dir):
    with pytest.raises(ValueError, match=r"sleep: level=3 must be 1"):
        sleepy.sleep(level=3)
    with pytest.raises(ValueError, match=r"wake_up: tags=\['weight'\]: unknown weight; allowed: weights, kv_cache"):
        sleepy.wake_up(tags=["weight"])
    req = sleepy.llm_engine.add_request(None, "def f(x):", h.GREEDY)
    with pytest.raises(ValueError, match=r"1 request\(s\) unfinished"):
        sleepy.sleep()
    sleepy.llm_engine.abort_request(req)
    assert not sleepy.llm_engine.is_sleeping()


def test_sleep_needs_sleep_mode(llama_dir):
    llm = LLM(model=str(llama_dir), **h.LLM_KWARGS)
    try:
        with pytest.raises(ValueError, match="sleep mode is off; build the engine with enable_sleep_mode=True"):
            llm.sleep()
        with pytest.raises(ValueError, match="sleep mode is off"):
            llm.wake_up()
    finally:
        llm.shutdown()
