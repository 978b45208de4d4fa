"""Model presets under conf/model/: each names a real checkpoint and carries its
published shape, so it runs offline with load.format=dummy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from minivllm import LLM, SamplingParams
from minivllm.attention.torch_backend import TorchAttentionBackend
from minivllm.config.store import build_config
from minivllm.models.registry import ModelRegistry

CONF_MODEL = Path(__file__).resolve().parents[2] / "conf" / "model"

# preset -> (architecture, parameter count published for the checkpoint, sliding windows of its layers)
PRESETS = {
    "opt-125m": ("OPTForCausalLM", 125_239_296, None),
    "gpt2": ("GPT2LMHeadModel", 124_439_808, None),
    "pythia-160m": ("GPTNeoXForCausalLM", 162_322_944, None),
    "qwen2.5-0.5b": ("Qwen2ForCausalLM", 494_032_768, None),
    "qwen3-0.6b": ("Qwen3ForCausalLM", 596_049_920, None),
    "llama-3.2-1b": ("LlamaForCausalLM", 1_235_814_400, None),
    "phi-3-mini": ("Phi3ForCausalLM", 3_821_079_552, 2047),
    "mistral-7b": ("MistralForCausalLM", 7_241_732_096, 4096),
    "gemma-2-2b": ("Gemma2ForCausalLM", 2_614_341_888, {4096, None}),
    "gemma-3-1b": ("Gemma3ForCausalLM", 999_885_952, {512, None}),
    "olmo-2-1b": ("Olmo2ForCausalLM", 1_484_916_736, None),
    "granite-3.1-2b": ("GraniteForCausalLM", 2_533_531_648, None),
    "qwen3-30b-a3b": ("Qwen3MoeForCausalLM", 30_532_122_624, None),
    "mixtral-8x7b": ("MixtralForCausalLM", 46_702_792_704, None),
}


def test_every_checkpoint_preset_is_checked_here():
    presets = {p.stem for p in CONF_MODEL.glob("*.yaml")} - {"demo"}  # demo ships its own checkpoint
    assert presets == set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_builds_the_published_model_shape(name):
    arch, num_params, window = PRESETS[name]
    cfg = build_config([f"model={name}", "load.format=dummy", "device=cpu"])
    assert cfg.architecture == arch
    with torch.device("meta"):  # shapes only: no memory, no init
        model = ModelRegistry.resolve(arch)(cfg.hf_config, TorchAttentionBackend())
        reference = AutoModelForCausalLM.from_config(cfg.hf_config)
    assert sum(p.numel() for p in model.parameters()) == num_params
    assert sum(p.numel() for p in reference.parameters()) == num_params
    windows = {m.sliding_window for m in model.modules() if hasattr(m, "sliding_window") and hasattr(m, "kv_cache")}
    assert windows == (window if isinstance(window, set) else {window})


@pytest.mark.parametrize("name", ["gpt2"])
def test_preset_generates_offline_on_dummy_weights(name, tokenizer_dir):
    """Random weights in [-1e-3, 1e-3] make every next token nearly equally likely:
    logprobs near -log(vocab) show the whole path ran on initialised weights."""
    llm = LLM(
        model=name,
        load_format="dummy",
        tokenizer=str(tokenizer_dir),
        hf_overrides={"num_hidden_layers": 2},
        dtype="float32",
        num_gpu_blocks_override=8,
    )
    assert llm.cfg.hf_config.num_hidden_layers == 2
    params = SamplingParams(temperature=0, max_tokens=4, logprobs=0, ignore_eos=True)
    out = llm.generate(["def main():"], params, use_tqdm=False)[0].outputs[0]
    llm.shutdown()
    vocab = llm.cfg.hf_config.vocab_size
    assert len(out.token_ids) == 4 and all(0 <= t < vocab for t in out.token_ids)
    for token, logprobs in zip(out.token_ids, out.logprobs):
        assert logprobs[token] == pytest.approx(-math.log(vocab), abs=0.05)


def test_fewer_layers_keep_the_per_layer_types_transformers_checks(tmp_path):
    """A num_hidden_layers override cuts layer_types to match: transformers refuses to save
    (so the hf baseline cannot share the weights of) a config whose list is longer."""
    from minivllm.config.store import build_config

    cfg = build_config(
        ["model=qwen3-0.6b", "load.format=dummy", "device=cpu", "+model.hf_overrides.num_hidden_layers=2"]
    )
    assert cfg.hf_config.num_hidden_layers == 2
    assert cfg.hf_config.layer_types == ["full_attention", "full_attention"]
    cfg.hf_config.save_pretrained(tmp_path)  # validates the per-layer lists
    gemma = build_config(
        ["model=gemma-3-1b", "load.format=dummy", "device=cpu", "+model.hf_overrides.num_hidden_layers=8"]
    )
    assert gemma.hf_config.layer_types == 5 * ["sliding_attention"] + ["full_attention"] + 2 * ["sliding_attention"]
