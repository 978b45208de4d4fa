"""Greedy decoding with each logit edit, token for token against transformers'
``generate`` (its own logits processors) on the same checkpoint, plus logprobs and
prompt logprobs against transformers' log_softmax of the same logits.

All configurations run in one mixed batch (each row keeps its own parameters).
Every feature test also checks that the feature changed the output, so a feature
that silently does nothing fails."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from minivllm import LLM, SamplingParams

PROMPTS = ["a a a a a a", "for i in range(10):\n    self.data = data\n"]
MAX_TOKENS = 10
EOS = 2  # tests.model_configs


@pytest.fixture(scope="module", params=[False, True], ids=["torch-sampler", "fused-sampler"])
def llm(llama_dir, request):
    # a small token budget splits prompts and batches across steps (chunked prefill); the fused
    # sampler (Triton, interpreted here) runs after the same logit edits
    engine = LLM(
        model=str(llama_dir),
        dtype="float32",
        block_size=8,
        num_gpu_blocks_override=96,
        max_num_batched_tokens=16,
        overrides=[f"compilation.fused_sampler={str(request.param).lower()}"],
    )
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def hf(llama_dir):
    return AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()


def _run(llm, configs: dict[str, dict]) -> dict[str, list[list[int]]]:
    """Greedy outputs of every prompt under every configuration, all in one batch."""
    names = list(configs)
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, **configs[n]) for n in names for _ in PROMPTS]
    outs = llm.generate(PROMPTS * len(names), params, use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outs]
    return {n: tokens[i * len(PROMPTS) : (i + 1) * len(PROMPTS)] for i, n in enumerate(names)}


@torch.no_grad()
def _theirs(llm, hf, **kwargs) -> list[list[int]]:
    out = []
    for prompt in PROMPTS:
        ids = torch.tensor([llm.get_tokenizer().encode(prompt)])
        gen = hf.generate(ids, do_sample=False, max_new_tokens=MAX_TOKENS, pad_token_id=0, **kwargs)
        out.append(gen[0, ids.shape[1] :].tolist())
    return out


@pytest.fixture(scope="module")
def ours(llm):
    first = _run(
        llm,
        {
            "plain": {},
            "repetition 1.3": dict(repetition_penalty=1.3),
            "repetition 0.4": dict(repetition_penalty=0.4),
            "min_tokens": dict(min_tokens=4, logit_bias={EOS: 30.0}),  # EOS would win every step once allowed
            "presence+frequency": dict(presence_penalty=0.8, frequency_penalty=0.6),
            "allowed": dict(allowed_token_ids=list(range(100, 200))),
        },
    )
    plain = first["plain"]
    tok = llm.get_tokenizer()
    second = _run(
        llm,
        {
            "logit_bias": dict(logit_bias={plain[0][0]: -100.0, plain[1][2]: -100.0, 77: 4.0}),
            "bad_words": dict(bad_words=[tok.decode([plain[0][1]]), tok.decode(plain[1][3:5])]),
        },
    )
    return first | second


def test_plain_greedy(llm, hf, ours):
    assert ours["plain"] == _theirs(llm, hf)


@pytest.mark.parametrize("penalty", [1.3, 0.4])
def test_repetition_penalty(llm, hf, ours, penalty):
    got = ours[f"repetition {penalty}"]
    assert got == _theirs(llm, hf, repetition_penalty=penalty)
    assert got != ours["plain"]


def test_min_tokens(llm, hf, ours):
    got = ours["min_tokens"]
    assert got == _theirs(llm, hf, min_new_tokens=4, sequence_bias={(EOS,): 30.0})
    assert all(len(t) == 5 and t[-1] == EOS for t in got)  # 4 forced tokens, then EOS ends it


def test_logit_bias(llm, hf, ours):
    plain = ours["plain"]
    bias = {plain[0][0]: -100.0, plain[1][2]: -100.0, 77: 4.0}
    assert ours["logit_bias"] == _theirs(llm, hf, sequence_bias={(t,): b for t, b in bias.items()})
    assert ours["logit_bias"] != plain


def test_bad_words(llm, hf, ours):
    plain, tok = ours["plain"], llm.get_tokenizer()
    words = [tok.decode([plain[0][1]]), tok.decode(plain[1][3:5])]  # a single-token word and a longer one
    bad_ids = llm.llm_engine.processor.prepare_params(SamplingParams(bad_words=words), None)._bad_words_token_ids
    assert any(len(b) > 1 for b in bad_ids)
    got = ours["bad_words"]
    assert got == _theirs(llm, hf, bad_words_ids=bad_ids)
    assert got != plain
    for out in got:
        for b in bad_ids:
            assert all(out[i : i + len(b)] != b for i in range(len(out)))


def test_allowed_token_ids(llm, hf, ours):
    allowed = list(range(100, 200))
    got = ours["allowed"]
    assert got == _theirs(llm, hf, prefix_allowed_tokens_fn=lambda batch, ids: allowed)
    assert all(100 <= t < 200 for out in got for t in out)


@torch.no_grad()
def test_presence_and_frequency_penalties_hand_computed(llm, hf, ours):
    presence, frequency = 0.8, 0.6
    got = ours["presence+frequency"]
    for prompt, tokens in zip(PROMPTS, got):
        ids, out = llm.get_tokenizer().encode(prompt), []
        for _ in range(MAX_TOKENS):
            logits = hf(torch.tensor([ids + out])).logits[0, -1]
            for t in set(out):  # OpenAI's formula, over the output tokens only
                logits[t] -= presence + frequency * out.count(t)
            out.append(int(logits.argmax()))
        assert tokens == out
    assert got != ours["plain"]


@torch.no_grad()
def test_logprobs_and_prompt_logprobs_match_transformers_log_softmax(llm, hf):
    k = 5
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=k, prompt_logprobs=3, repetition_penalty=0.4)
    prompts = [PROMPTS[1], PROMPTS[0]]
    llm.generate(prompts[0], SamplingParams(max_tokens=1), use_tqdm=False)  # its prompt blocks are now cached
    outs = llm.generate(prompts, [params, SamplingParams(max_tokens=3)], use_tqdm=False)
    assert outs[1].prompt_logprobs is None and outs[1].outputs[0].logprobs is None
    out = outs[0]
    ids = out.prompt_token_ids
    assert len(ids) > 16  # longer than the token budget: its prompt logprobs come from several steps
    gen = hf.generate(
        torch.tensor([ids]),
        do_sample=False,
        max_new_tokens=6,
        repetition_penalty=0.4,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    completion = out.outputs[0]
    assert completion.token_ids == gen.sequences[0, len(ids) :].tolist()
    raw = [step[0].log_softmax(-1) for step in gen.logits]  # raw logits: before the repetition penalty
    assert len(completion.logprobs) == 6
    for token, entry, ref in zip(completion.token_ids, completion.logprobs, raw):
        _assert_entry(entry, token, ref, k)
    assert completion.cumulative_logprob == pytest.approx(
        sum(r[t].item() for t, r in zip(completion.token_ids, raw)), abs=1e-3
    )
    plp = out.prompt_logprobs
    assert len(plp) == len(ids) and plp[0] is None
    ref = hf(torch.tensor([ids])).logits[0].log_softmax(-1)  # (P, V); row p predicts token p + 1
    for pos in range(1, len(ids)):
        _assert_entry(plp[pos], ids[pos], ref[pos - 1], 3)


def _assert_entry(entry: dict[int, float], token: int, ref: torch.Tensor, k: int) -> None:
    """``entry`` holds ``token`` and the top ``k`` of the reference log-probabilities, to 1e-4."""
    assert set(entry) == set(ref.topk(k).indices.tolist()) | {token}
    for t, lp in entry.items():
        assert lp == pytest.approx(ref[t].item(), abs=1e-4)
