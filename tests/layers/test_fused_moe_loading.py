"""FusedMoE loads per-expert checkpoint tensors into its stacked parameters:
each expert's intermediate dim sliced over ranks (tensor parallel), or whole
experts per rank (expert parallel). Ranks are faked, as in test_tp_sharding."""

from __future__ import annotations

import pytest
import torch

from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.store import build_config
from minivllm.layers.fused_moe import FusedMoE, expert_weight_target
from minivllm.layers.fused_moe import layer as moe_layer

E, H, I = 4, 6, 8


@pytest.fixture
def experts():
    gen = torch.Generator().manual_seed(0)
    return [
        {w: torch.randn(*((H, I) if w == "w2" else (I, H)), generator=gen) for w in ("w1", "w3", "w2")}
        for _ in range(E)
    ]


class Unreadable:
    """A lazy checkpoint slice that must not be read (an expert held by another rank)."""

    def get_shape(self):
        return (I, H)

    def __getitem__(self, index):
        raise AssertionError("read a tensor this rank does not hold")


def _load(moe: FusedMoE, experts, owned=range(E)) -> None:
    for e, tensors in enumerate(experts):
        for which, tensor in tensors.items():
            param = moe.w2 if which == "w2" else moe.w13
            moe.weight_loader(param, tensor if e in owned else Unreadable(), (e, which))


def _as_rank(monkeypatch, rank: int, size: int) -> None:
    monkeypatch.setattr(moe_layer, "tp_rank", lambda: rank)
    monkeypatch.setattr(moe_layer, "tp_size", lambda: size)


def test_tensor_parallel_slices_every_experts_intermediate_dim(monkeypatch, experts):
    _as_rank(monkeypatch, rank=1, size=2)
    moe = FusedMoE(E, 2, H, I, renormalize=True)
    assert moe.w13.shape == (E, 2 * I // 2, H) and moe.w2.shape == (E, H, I // 2)
    _load(moe, experts)
    half = slice(I // 2, I)  # rank 1's rows of w1/w3, columns of w2
    for e, t in enumerate(experts):
        assert torch.equal(moe.w13[e], torch.cat([t["w1"][half], t["w3"][half]]))
        assert torch.equal(moe.w2[e], t["w2"][:, half])


def test_expert_parallel_places_whole_experts_and_skips_the_rest_unread(monkeypatch, experts):
    _as_rank(monkeypatch, rank=1, size=2)
    moe = FusedMoE(E, 2, H, I, renormalize=True, expert_parallel=True)
    assert (moe.first_expert, moe.num_local_experts) == (2, 2)
    assert moe.w13.shape == (2, 2 * I, H) and moe.w2.shape == (2, H, I)
    _load(moe, experts, owned=(2, 3))
    for local, e in enumerate((2, 3)):
        assert torch.equal(moe.w13[local], torch.cat([experts[e]["w1"], experts[e]["w3"]]))
        assert torch.equal(moe.w2[local], experts[e]["w2"])


def test_checkpoint_names_map_to_stacked_parameters():
    assert expert_weight_target("model.layers.3.mlp.experts.17.up_proj.weight") == (
        "model.layers.3.mlp.experts.w13",
        (17, "w3"),
    )
    assert expert_weight_target("model.layers.0.mlp.experts.2.w2.weight") == (
        "model.layers.0.mlp.experts.w2",
        (2, "w2"),
    )
    assert expert_weight_target("model.layers.0.mlp.gate.weight") is None
    assert expert_weight_target("model.layers.0.mlp.gate_proj.weight") is None  # a dense MLP


def test_expert_parallel_config_is_checked_when_built():
    base = ["model=mixtral-8x7b", "load.format=dummy", "device=cpu"]
    assert build_config([*base, "parallel.enable_expert_parallel=true"]).parallel.enable_expert_parallel
    with pytest.raises(ValueError, match="parallel.enable_expert_parallel=true: the model has no experts"):
        build_config(["model=qwen3-0.6b", "load.format=dummy", "device=cpu", "parallel.enable_expert_parallel=true"])
    with pytest.raises(ValueError, match=r"parallel.tp=4: with parallel.enable_expert_parallel=true the model's 6"):
        build_config(
            [*base, "parallel.tp=4", "parallel.enable_expert_parallel=true", "+model.hf_overrides.num_local_experts=6"]
        )
    qwen = ["model=qwen3-30b-a3b", "load.format=dummy", "device=cpu", "+model.hf_overrides.moe_intermediate_size=767"]
    with pytest.raises(ValueError, match="parallel.tp=2: each expert's intermediate size 767 is not divisible"):
        build_config([*qwen, "parallel.tp=2"])
    assert build_config([*qwen, "parallel.tp=2", "parallel.enable_expert_parallel=true"]).parallel.tp == 2


def test_llm_keyword_maps_to_the_config_key():
    cfg = config_from_kwargs("mixtral-8x7b", load_format="dummy", enable_expert_parallel=True)
    assert cfg.parallel.enable_expert_parallel is True
