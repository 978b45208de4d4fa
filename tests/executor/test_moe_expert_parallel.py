"""A MoE model at tp=2, experts sliced (tensor parallel) or placed whole on ranks
(expert parallel), gives tp=1's tokens and logprobs."""

from __future__ import annotations

import pytest

from minivllm import LLM
from tests.executor import tp_helpers as h
from tests.models.parity_cases import PARITY_CASES

pytestmark = pytest.mark.slow

CASE = next(c for c in PARITY_CASES if c.architecture == "Qwen3MoeForCausalLM")  # 8 experts, a dense layer too
EXPERTS = "model.layers.0.mlp.experts."


@pytest.fixture(scope="module")
def moe_dir(make_checkpoint):
    return make_checkpoint(CASE.name, CASE.config())


@pytest.fixture(scope="module")
def tp1_outputs(moe_dir):
    return h.reference(moe_dir)


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp-sliced-experts", "expert-parallel"])
def test_moe_tp2_matches_tp1(moe_dir, tp1_outputs, expert_parallel):
    llm = LLM(model=str(moe_dir), tensor_parallel_size=2, enable_expert_parallel=expert_parallel, **h.LLM_KWARGS)
    try:
        shapes = llm.llm_engine.core.executor.collective_rpc(h.param_shapes)
        outputs = h.generate(llm)
    finally:
        llm.shutdown()
    config = CASE.config()
    E, I, H = config.num_experts, config.moe_intermediate_size, config.hidden_size
    local = (E // 2, 2 * I, H) if expert_parallel else (E, 2 * I // 2, H)
    assert [s[EXPERTS + "w13"] for s in shapes] == [local, local]
    h.assert_same_outputs(tp1_outputs, outputs)
