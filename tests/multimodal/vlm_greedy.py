"""Greedy decoding of image prompts, by transformers (the oracle of the image models' tests:
LLaVA and Qwen2-VL build their inputs differently, the decoding and what is read back are
shared) and by the engine; and the check used where exact equality is not expected (ours
in bf16 against transformers in fp32)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from minivllm import LLM, SamplingParams


@dataclass(frozen=True)
class Greedy:
    tokens: list[int]
    margins: list[float]
    """Per step, transformers' top-1 minus top-2 logit: how sure the reference is of that token."""


def hf_greedy(model: torch.nn.Module, inputs: dict[str, torch.Tensor], max_tokens: int) -> Greedy:
    """Exactly ``max_tokens`` greedy tokens after the prompt of ``inputs`` (moved to the model's device)."""
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in inputs.items()}
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    n = inputs["input_ids"].shape[1]
    top2 = [logits[0].float().topk(2).values for logits in out.logits]
    return Greedy(out.sequences[0, n:].tolist(), [(t[0] - t[1]).item() for t in top2])


def agreed_steps(ours: list[int], reference: Greedy, min_margin: float) -> int:
    """Asserts that ``ours`` equals the reference's tokens up to its first step whose margin is
    under ``min_margin`` (there a lower precision may pick the runner-up); returns that count."""
    sure = next((i for i, m in enumerate(reference.margins) if m < min_margin), len(reference.margins))
    assert ours[:sure] == reference.tokens[:sure], (ours, reference)
    return sure


def engine_greedy(llm: LLM, prompts: list[tuple[str, list[Any]]], max_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids as the engine expanded them, greedy output tokens) of each (text, images) prompt."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt": p, "multi_modal_data": {"image": ims}} for p, ims in prompts], params)
    return [(out.prompt_token_ids, list(out.outputs[0].token_ids)) for out in outs]
