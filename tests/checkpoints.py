"""Small Hugging Face checkpoints built on the spot: transformers config, random
weights, and a byte-level BPE tokenizer trained with ``tokenizers`` on local text.

Both minivllm and transformers load the same files, so transformers' own
implementation is the reference for every parity test.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedTokenizerFast

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}


def local_corpus(max_chars: int = 400_000) -> list[str]:
    """Text that exists on every machine with Python: the standard library's source."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        texts.append(text)
        total += len(text)
        if total > max_chars:
            break
    return texts


def train_tokenizer(out_dir: Path, vocab_size: int = 512) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[SPECIAL["pad_token"], SPECIAL["bos_token"], SPECIAL["eos_token"], SPECIAL["unk_token"]],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(local_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL)
    fast.save_pretrained(out_dir)
    return fast


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


def read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())
