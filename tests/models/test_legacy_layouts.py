"""Older hub checkpoints name and pack tensors differently from what transformers
writes today; both layouts must load into the same parameters."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from minivllm.attention.torch_backend import TorchAttentionBackend
from minivllm.models.gpt2 import GPT2LMHeadModel
from minivllm.models.gpt_neox import GPTNeoXForCausalLM
from tests.model_configs import gpt2_config, gpt_neox_config


def _load(model_cls, config, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    model = model_cls(config, TorchAttentionBackend())
    model.load_weights(weights.items())
    return model.state_dict()


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_gpt2_hub_layout_without_prefix_and_with_mask_buffers(make_checkpoint):
    config = gpt2_config()
    modern = load_file(make_checkpoint("gpt2-conv1d-tied", config) / "model.safetensors")
    legacy = {name.removeprefix("transformer."): t for name, t in modern.items()}
    for i in range(config.n_layer):  # GPT-2's original files carry the causal mask as a buffer
        legacy[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 8, 8))
        legacy[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    assert "h.0.attn.c_attn.weight" in legacy and "transformer.wte.weight" not in legacy
    _assert_same(_load(GPT2LMHeadModel, config, modern), _load(GPT2LMHeadModel, config, legacy))


def test_gpt_neox_checkpoint_buffers_are_skipped(make_checkpoint):
    config = gpt_neox_config()
    modern = load_file(make_checkpoint("gpt-neox-parallel-rotary25", config) / "model.safetensors")
    legacy = dict(modern)
    for i in range(config.num_hidden_layers):  # Pythia's files carry these buffers
        legacy[f"gpt_neox.layers.{i}.attention.bias"] = torch.tril(torch.ones(1, 1, 8, 8))
        legacy[f"gpt_neox.layers.{i}.attention.masked_bias"] = torch.tensor(-1e9)
        legacy[f"gpt_neox.layers.{i}.attention.rotary_emb.inv_freq"] = torch.ones(2)
    _assert_same(_load(GPTNeoXForCausalLM, config, modern), _load(GPTNeoXForCausalLM, config, legacy))
