"""Small Hugging Face checkpoints built on the spot: transformers config, random
weights, and a byte-level BPE tokenizer trained with ``tokenizers`` on local text.

Both minivllm and transformers load the same files, so transformers' own
implementation is the reference for every parity test.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from tools.tiny_vlm import SPECIAL, local_corpus, train_tokenizer  # noqa: F401 (the tests' tokenizer)


def save_checkpoint(
    config: PretrainedConfig,
    out_dir: Path,
    tokenizer_dir: Path,
    *,
    seed: int = 0,
    safe_serialization: bool = True,
    max_shard_size: str | None = None,
) -> Path:
    """Random weights for ``config`` saved with transformers, plus the tokenizer files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _spread_weights(model, seed)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, **kwargs)
    if not safe_serialization:  # transformers 5 writes safetensors only; make the pickle ourselves
        _convert_to_pt(out_dir)
    for f in tokenizer_dir.iterdir():
        (out_dir / f.name).write_bytes(f.read_bytes())
    return out_dir


def _convert_to_pt(out_dir: Path) -> None:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(out_dir.glob("*.safetensors")):
        state.update(load_file(f))
        f.unlink()
    torch.save(state, out_dir / "pytorch_model.bin")


@torch.no_grad()
def _spread_weights(model: torch.nn.Module, seed: int) -> None:
    """Larger-than-default random weights so logits are peaked and greedy tokens differ
    between prompts (HF's 0.02 init makes nearly uniform, tie-prone distributions)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=gen) * (1.5 / p.shape[-1] ** 0.5))
        elif "norm" in name or ".ln_" in name:  # GPT-2 names its LayerNorms ln_1, ln_2, ln_f
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):  # DeepSeek V3's routing offset: zero would test nothing
            b.copy_(0.3 * torch.randn(b.shape, generator=gen))


def read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())
