"""Memory profiling sees the smaller weights: for the same ``cache.cpu_memory_gb`` a
quantized model leaves more KV-cache blocks than the unquantized one.

The tiny checkpoints are widened with ``hf_overrides`` and run on random
(``load.format=dummy``) weights, so that the weights saved (about 85 MiB for fp8)
stand well above what the profile's activation peak varies by (the CPU path
dequantizes one layer's weight at a time, and the resident-memory high-water
mark moves by tens of MiB with the allocator).
"""

from __future__ import annotations

import pytest

from minivllm import LLM

WIDE = {"hidden_size": 512, "head_dim": 128, "intermediate_size": 1024, "num_hidden_layers": 12}
LAYERS = WIDE["num_hidden_layers"]
LINEAR_PARAMS = LAYERS * 512 * (1024 + 512 + 2 * 1024 + 1024)  # per layer: qkv (512 + 2 * 256), o, gate_up, down


def _profile(ckpt) -> tuple[int, int, int]:
    """(KV blocks, bytes of all weights, bytes of the linear layers' weights)."""
    llm = LLM(
        model=str(ckpt),
        dtype="float32",
        load_format="dummy",
        hf_overrides=WIDE,
        cpu_memory_gb=0.5,
        max_num_batched_tokens=256,
        max_model_len=256,
    )
    try:
        model = llm.llm_engine.core.executor.worker.model_runner.model
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        linear = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "_proj." in n)
        return llm.llm_engine.scheduler_stats().num_blocks, total, linear
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def plain(quantized_pair):
    return _profile(quantized_pair("fp8-channel-dynamic")[1])


def test_fp8_weights_take_a_quarter_and_leave_more_blocks(quantized_pair, plain):
    blocks, total, linear = _profile(quantized_pair("fp8-channel-dynamic")[0])
    assert plain[2] == 4 * LINEAR_PARAMS
    assert linear == LINEAR_PARAMS + LAYERS * 4 * (1024 + 512 + 2048 + 512)  # fp8 bytes + an fp32 scale per output
    assert plain[1] - total == plain[2] - linear
    assert blocks > plain[0]


def test_awq_weights_take_about_a_sixth_and_leave_more_blocks(quantized_pair, plain):
    blocks, total, linear = _profile(quantized_pair("awq-g32")[0])
    # per weight: half a byte, plus fp32 scale and uint8 zero per 32 weights, plus int32 group per input row
    assert linear < plain[2] / 5.5
    assert blocks > plain[0]
