"""Sleep mode on CUDA: device memory (as the driver reports it) comes back at level 1 and 2, the
CUDA graphs are captured again on waking (the KV cache and weights have new addresses), and greedy
outputs after waking, and after an in-place update under live graphs, equal those before."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM
from tests.executor import tp_helpers as h
from tests.worker import rl_helpers as rl

pytestmark = pytest.mark.gpu
KWARGS = dict(h.LLM_KWARGS, num_gpu_blocks_override=8192, device="cuda", enable_sleep_mode=True)


def _device_used() -> int:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free


def _runner(llm: LLM):
    return llm.llm_engine.core.executor.worker.model_runner


@pytest.fixture(scope="module")
def gpu_llm(llama_dir):
    llm = LLM(model=str(llama_dir), worker_extension_cls=rl.EXTENSION, **KWARGS)
    assert _runner(llm).cuda_graphs is not None  # captured: the Triton backend on CUDA
    yield llm
    llm.shutdown()


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_returns_device_memory_and_recaptures_graphs(gpu_llm, llama_dir, level):
    expected = h.generate(gpu_llm)
    report = rl.memory(gpu_llm)[0]
    graphs_before, used_before = _runner(gpu_llm).cuda_graphs, _device_used()
    gpu_llm.sleep(level=level)
    released = used_before - _device_used()
    assert released >= 0.9 * (report["kv_bytes"] + report["weight_bytes"]), (released, report)
    assert _runner(gpu_llm).cuda_graphs is None
    gpu_llm.wake_up(tags=["weights"])
    if level == 2:
        gpu_llm.collective_rpc("update_weights_from_path", args=(str(llama_dir),))
    gpu_llm.wake_up(tags=["kv_cache"])
    graphs = _runner(gpu_llm).cuda_graphs
    assert graphs is not None and graphs is not graphs_before
    h.assert_same_outputs(expected, h.generate(gpu_llm), atol=1e-3)


def test_update_under_live_graphs_equals_fresh_engine(gpu_llm, llama_dir, tmp_path):
    """The update copies into the existing parameters, so the captured graphs stay valid."""
    ckpt_b = rl.perturbed_copy(llama_dir, tmp_path / "b")
    fresh = LLM(model=str(ckpt_b), **KWARGS)
    try:
        expected = h.generate(fresh)
    finally:
        fresh.shutdown()
    graphs = _runner(gpu_llm).cuda_graphs
    gpu_llm.collective_rpc("update_weights_from_path", args=(str(ckpt_b),))
    assert gpu_llm.reset_prefix_cache()
    assert _runner(gpu_llm).cuda_graphs is graphs
    h.assert_same_outputs(expected, h.generate(gpu_llm), atol=1e-3)
    gpu_llm.collective_rpc("update_weights_from_path", args=(str(llama_dir),))
    assert gpu_llm.reset_prefix_cache()
