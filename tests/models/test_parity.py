"""Every model family against transformers on the same tiny checkpoint.

For a batch of token-id prompts of different lengths (block_size 8, so prompts
and generations cross block boundaries), minivllm generates greedily with
logprobs. transformers then runs its own forward pass over each prompt plus the
generated tokens: at every generated position its argmax must be the token
minivllm chose (so transformers' greedy decoding yields the same sequence) and
its log_softmax of that token must match minivllm's logprob to 1e-4 in fp32.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from minivllm import LLM, SamplingParams
from minivllm.attention.torch_backend import TorchAttentionBackend
from minivllm.config.store import build_config
from minivllm.model_loader.loader import DefaultModelLoader
from tests.models.parity_cases import PARITY_CASES, ParityCase

PROMPT_LENS = (3, 8, 13, 21)
MAX_TOKENS = 10
FP32_ATOL = 1e-4


def _prompts(vocab_size: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(4, vocab_size, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def _generate(ckpt, prompts, dtype: str, **kwargs) -> list[tuple[list[int], list[float]]]:
    llm = LLM(model=str(ckpt), dtype=dtype, block_size=8, num_gpu_blocks_override=64, **kwargs)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.shutdown()
    results = []
    for out in outs:
        comp = out.outputs[0]
        results.append((comp.token_ids, [lp[t] for t, lp in zip(comp.token_ids, comp.logprobs)]))
    return results


@torch.no_grad()
def _reference_logprobs(hf_model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """transformers' (len(generated), vocab) log-probabilities at each generated position."""
    ids = torch.tensor([prompt + generated])
    logits = hf_model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return logits.float().log_softmax(dim=-1)


def _load_hf(ckpt, dtype=torch.float32):
    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, attn_implementation="eager").eval()


def _assert_matches_transformers(hf_model, prompts, results) -> None:
    for prompt, (tokens, logprobs) in zip(prompts, results):
        assert len(tokens) == MAX_TOKENS
        ref = _reference_logprobs(hf_model, prompt, tokens)
        assert ref.argmax(dim=-1).tolist() == tokens, f"greedy tokens differ for a {len(prompt)}-token prompt"
        ref_chosen = ref.gather(1, torch.tensor(tokens)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(logprobs), ref_chosen, atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize("case", PARITY_CASES, ids=lambda c: c.name)
def test_greedy_logprobs_match_transformers_fp32(case: ParityCase, make_checkpoint):
    ckpt = make_checkpoint(case.name, case.config())
    hf_model = _load_hf(ckpt)
    assert type(hf_model).__name__ == case.architecture
    prompts = _prompts(hf_model.config.vocab_size)
    _assert_matches_transformers(hf_model, prompts, _generate(ckpt, prompts, "float32"))


WINDOWED = [
    c
    for c in PARITY_CASES
    if c.name in ("mistral-window5-mqa", "qwen2-bias-window-on-layer1", "gemma2-softcaps-window6-alternating")
]


@pytest.mark.parametrize("case", WINDOWED, ids=lambda c: c.name)
def test_sliding_window_under_chunked_prefill(case: ParityCase, make_checkpoint):
    """A 16-token step budget splits the long prompts into chunks that start past
    the window, mixed with other requests' decode tokens in the same step."""
    ckpt = make_checkpoint(case.name, case.config())
    hf_model = _load_hf(ckpt)
    prompts = _prompts(hf_model.config.vocab_size)
    results = _generate(ckpt, prompts, "float32", max_num_batched_tokens=16, max_model_len=64)
    _assert_matches_transformers(hf_model, prompts, results)


BF16_ATOL = 0.25
"""bf16 rounding moves these tiny models' logprobs by up to ~0.17; a mis-loaded weight moves them by nats."""
BF16_OWN_TEST = {"Qwen3NextForCausalLM"}
"""Architectures whose transformers bf16 itself moves these checkpoints' logprobs past ``BF16_ATOL``
(Qwen3-Next: ~0.8 nats); their bf16 is checked against that drift in their own test module."""
ONE_CASE_PER_ARCH = list({c.architecture: c for c in reversed(PARITY_CASES)}.values())


def _every_expert_active(case: ParityCase) -> ParityCase:
    """For MoE models: the same case with every token routed to every expert.

    Top-k routing is a discrete choice: bf16 rounding of one router logit can
    swap an expert and move a logprob by nats, which no tolerance separates from
    a mis-loaded weight. With k = num_experts the choice disappears and the
    model is a continuous function of its (bf16) weights again."""
    config = case.config()
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if not experts:
        return case
    config.num_experts_per_tok = experts
    return ParityCase(f"{case.name}-every-expert", case.architecture, lambda: config)


@pytest.mark.parametrize(
    "case", [c for c in ONE_CASE_PER_ARCH if c.architecture not in BF16_OWN_TEST], ids=lambda c: c.architecture
)
def test_bf16_weights_load_and_generate(case: ParityCase, make_checkpoint):
    case = _every_expert_active(case)
    ckpt = make_checkpoint(case.name, case.config())
    cfg = build_config([f"model.path={ckpt}", "model.dtype=bfloat16", "device=cpu"])
    model = DefaultModelLoader().load_model(cfg, TorchAttentionBackend(), torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    hf_model = _load_hf(ckpt)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in hf_model.parameters())

    prompts = _prompts(hf_model.config.vocab_size)
    for prompt, (tokens, logprobs) in zip(prompts, _generate(ckpt, prompts, "bfloat16")):
        assert len(tokens) == MAX_TOKENS
        ref = _reference_logprobs(hf_model, prompt, tokens)  # fp32 transformers on bf16's tokens
        ref_chosen = ref.gather(1, torch.tensor(tokens)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(logprobs), ref_chosen, atol=BF16_ATOL, rtol=0)
        assert (ref.max(dim=-1).values - ref_chosen).max() < BF16_ATOL, "bf16 picked a token fp32 finds unlikely"
