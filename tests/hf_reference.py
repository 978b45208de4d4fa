"""transformers' own greedy decoding, the oracle of every parity test."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def hf_greedy(checkpoint: Path, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
    """For each prompt: (greedy tokens, logprob of each chosen token), in fp32, no EOS stop."""
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    results = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
            tokens = out.sequences[0, len(ids) :].tolist()
            logprobs = [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, tokens)]
            results.append((tokens, logprobs))
    return results
