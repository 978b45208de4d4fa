"""The MoE parity cases exercise what makes MoE hard: more experts than each
token visits, uneven load across experts, and steps in which an expert
receives no token at all (its GEMM must be skipped, not run on garbage).

The routing is recorded inside minivllm's own run of the parity prompts, so
these properties hold for the very steps that test_parity checks."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.layers.fused_moe import FusedMoE, route
from tests.models.parity_cases import PARITY_CASES, ParityCase
from tests.models.test_parity import MAX_TOKENS, _prompts

MOE_CASES = [c for c in PARITY_CASES if c.architecture in ("Qwen3MoeForCausalLM", "MixtralForCausalLM")]


def _model(worker):
    return worker.model_runner.model


def _record_expert_loads(model: torch.nn.Module) -> list[torch.Tensor]:
    """Hooks every MoE layer; each forward (one layer, one step) appends its (E,) tokens-per-expert."""
    loads: list[torch.Tensor] = []

    def hook(moe: FusedMoE, args, output) -> None:
        _, ids = route(args[1], moe.top_k, moe.renormalize)
        loads.append(torch.bincount(ids.flatten(), minlength=moe.num_experts))

    for module in model.modules():
        if isinstance(module, FusedMoE):
            module.register_forward_hook(hook)
    return loads


@pytest.mark.parametrize("case", MOE_CASES, ids=lambda c: c.name)
def test_moe_case_routes_unevenly_and_idles_an_expert(case: ParityCase, make_checkpoint):
    config = case.config()
    ckpt = make_checkpoint(case.name, config)
    experts = getattr(config, "num_local_experts", None) or config.num_experts
    assert experts > config.num_experts_per_tok

    llm = LLM(model=str(ckpt), dtype="float32", block_size=8, num_gpu_blocks_override=64)
    loads = _record_expert_loads(llm.llm_engine.core.executor.collective_rpc(_model)[0])
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in _prompts(config.vocab_size)], params, use_tqdm=False)
    llm.shutdown()

    per_step = torch.stack(loads)  # (steps * moe layers, E)
    assert (per_step == 0).any(dim=1).any(), "no step left an expert without tokens"
    busy = per_step[(per_step > 0).all(dim=1)]  # steps where every expert has work (prefill)
    uneven = busy.max(dim=1).values >= 2 * busy.min(dim=1).values
    assert uneven.any(), f"no step routes unevenly: {busy.tolist()}"
