"""The fused-MoE pieces: routing against transformers' routers, the expert-sorted
layout, and the Triton kernel against the torch reference (interpreter on the CPU)."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import MixtralConfig, Qwen3MoeConfig
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

from minivllm.layers.fused_moe import route, torch_fused_experts
from minivllm.layers.fused_moe.layer import to_local_ids
from minivllm.layers.fused_moe.triton_experts import align_by_expert

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRETED, reason="CPU runs need TRITON_INTERPRET=1")),
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
    ),
]


@pytest.mark.parametrize(
    "router_cls, config",
    [
        (MixtralTopKRouter, MixtralConfig(hidden_size=16, num_local_experts=8, num_experts_per_tok=2)),
        (Qwen3MoeTopKRouter, Qwen3MoeConfig(hidden_size=16, num_experts=8, num_experts_per_tok=3)),
        (Qwen3MoeTopKRouter, Qwen3MoeConfig(hidden_size=16, num_experts=8, num_experts_per_tok=3, norm_topk_prob=True)),
    ],
)
def test_route_matches_transformers_routers(router_cls, config):
    gen = torch.Generator().manual_seed(0)
    hf_router = router_cls(config)
    hf_router.weight.data = torch.randn(hf_router.weight.shape, generator=gen)
    hidden = torch.randn(40, 16, generator=gen)
    _, hf_weights, hf_ids = hf_router(hidden)
    renormalize = getattr(config, "norm_topk_prob", True)
    weights, ids = route(hidden @ hf_router.weight.T, config.num_experts_per_tok, renormalize)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights.float())
    assert torch.allclose(weights.sum(-1), torch.ones(40)) == renormalize


def test_align_groups_pairs_by_expert_padded_to_the_block():
    ids = torch.tensor([[1, 0], [1, 1], [0, 1], [3, -1]])  # flat: 1 0 1 1 0 1 3 -1; expert 2 gets nothing
    routing = align_by_expert(ids, num_experts=4, block_m=4)
    N = 8  # padding sentinel: the number of (token, slot) pairs
    used = int(routing.num_padded.item())
    assert used == 12
    assert routing.sorted_ids[:used].tolist() == [1, 4, N, N, 0, 2, 3, 5, 6, N, N, N]
    assert routing.sorted_ids[used:].eq(N).all()  # worst-case buffer: the rest is padding
    assert routing.block_experts.tolist()[:3] == [0, 1, 3]
    assert routing.block_experts[3:].eq(-1).all()


def test_to_local_ids_marks_other_ranks_experts():
    ids = torch.tensor([[0, 5], [3, 4], [7, 2]])
    assert to_local_ids(ids, first_expert=4, num_local=4).tolist() == [[-1, 1], [-1, 0], [3, -1]]


# (tokens, experts, top_k, hidden, intermediate, expert-parallel slice); few launches: the interpreter is slow
KERNEL_CASES = [
    (1, 4, 1, 16, 16, False),  # one decode token
    (37, 8, 2, 24, 40, True),  # ragged sizes (masking on every edge); half the experts on another rank
    (300, 64, 8, 16, 32, False),  # many tokens and experts, the large row block
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T, E, k, H, I, ep", KERNEL_CASES, ids=lambda v: str(v))
def test_triton_fused_experts_matches_torch_reference(device, T, E, k, H, I, ep):
    from minivllm.layers.fused_moe.triton_experts import triton_fused_experts

    gen = torch.Generator().manual_seed(T)
    hidden = torch.randn(T, H, generator=gen)
    w13 = torch.randn(E, 2 * I, H, generator=gen) / H**0.5
    w2 = torch.randn(E, H, I, generator=gen) / I**0.5
    weights, ids = route(torch.randn(T, E, generator=gen) * 3, k, renormalize=True)
    if ep:  # this rank holds experts E/2 .. E-1 (local 0 .. E/2-1)
        ids = to_local_ids(ids, first_expert=E // 2, num_local=E // 2)
        w13, w2 = w13[E // 2 :], w2[E // 2 :]
        assert (ids < 0).any() and (ids >= 0).any()
    expected = torch_fused_experts(hidden, w13, w2, weights, ids)
    args = [t.to(device) for t in (hidden, w13, w2, weights, ids)]
    actual = triton_fused_experts(*args).cpu()
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_triton_wrapper_rejects_mismatched_shapes():
    from minivllm.layers.fused_moe.triton_experts import triton_fused_experts

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not INTERPRETED:
        pytest.skip("CPU runs need TRITON_INTERPRET=1")
    hidden, weights, ids = torch.randn(3, 16), torch.ones(3, 2), torch.zeros(3, 2, dtype=torch.long)
    w13, w2 = torch.randn(4, 32, 16), torch.randn(4, 16, 16)
    with pytest.raises(ValueError, match="w2 must be"):
        triton_fused_experts(*(t.to(device) for t in (hidden, w13, w2[:, :, :8], weights, ids)))
    with pytest.raises(ValueError, match="features"):
        triton_fused_experts(*(t.to(device) for t in (hidden[:, :8], w13, w2, weights, ids)))
    with pytest.raises(ValueError, match="topk_ids"):
        triton_fused_experts(*(t.to(device) for t in (hidden, w13, w2, weights, ids[:2])))
