"""Mixture-of-experts: top-k routing, stacked experts, a Triton fused kernel and a torch reference."""

from minivllm.layers.fused_moe.layer import (
    FusedMoE,
    SparseMoeBlock,
    expert_weight_target,
    fused_experts,
    route,
    torch_fused_experts,
)

__all__ = ["FusedMoE", "SparseMoeBlock", "expert_weight_target", "fused_experts", "route", "torch_fused_experts"]
