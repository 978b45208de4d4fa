"""PEFT adapters made on the spot for tiny base checkpoints, and transformers+peft greedy decoding."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@torch.no_grad()
def make_adapter(
    base: Path,
    out: Path,
    *,
    rank: int = 8,
    alpha: int = 16,
    seed: int = 0,
    targets: list[str] = ALL_TARGETS,
    use_rslora: bool = False,
) -> Path:
    """A LoRA adapter with random, non-zero A and B (PEFT initialises B to zero)."""
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, use_rslora=use_rslora, lora_dropout=0.0)
    peft_model = get_peft_model(model, cfg)
    gen = torch.Generator().manual_seed(seed)
    for name, p in peft_model.named_parameters():
        if "lora_" in name:
            p.copy_(torch.randn(p.shape, generator=gen) * (0.6 / p.shape[-1] ** 0.5))
    peft_model.save_pretrained(out)
    return out


@torch.no_grad()
def peft_greedy(base: Path, adapter: Path | None, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers (+ peft when ``adapter`` is given) greedy tokens for each prompt, no EOS stop."""
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    outs = []
    for ids in prompts:
        seq = model.generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        outs.append(seq[0, len(ids) :].tolist())
    return outs
