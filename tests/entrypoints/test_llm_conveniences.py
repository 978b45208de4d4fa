"""vLLM's small conveniences on ``LLM``: Logprob objects, logprobs=-1, num_cached_tokens,
detokenize / truncate_prompt_tokens / logits_processors, prompt TypedDicts,
reset_prefix_cache and get_metrics. The oracle is the engine without the feature."""

from __future__ import annotations

import math

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.inputs import TextPrompt, TokensPrompt

GREEDY = dict(temperature=0.0, max_tokens=5, ignore_eos=True)
LONG = "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):\n        self.path = path\n"


@pytest.fixture(scope="module")
def llm(llama_dir):
    torch.set_num_threads(1)
    kwargs = dict(dtype="float32", block_size=4, disable_log_stats=True, num_gpu_blocks_override=128)
    return LLM(str(llama_dir), max_logprobs=-1, **kwargs)


def test_logprob_objects_carry_rank_and_text(llm):
    out = llm.generate("def f(x):", SamplingParams(**GREEDY, logprobs=3, prompt_logprobs=2), use_tqdm=False)[0]
    tok = llm.get_tokenizer()
    for token, entry in zip(out.outputs[0].token_ids, out.outputs[0].logprobs):
        assert entry[token].rank == 1  # greedy picks the most likely token
        ranked = sorted(entry.values(), key=lambda lp: lp.rank)
        assert [lp.rank for lp in ranked] == [1, 2, 3]
        assert [lp.logprob for lp in ranked] == sorted((lp.logprob for lp in ranked), reverse=True)
        assert all(lp.decoded_token == tok.decode([t]) for t, lp in entry.items())
    first = out.prompt_logprobs[1]
    prompt_token = out.prompt_token_ids[1]
    assert isinstance(first[prompt_token].logprob, float)
    assert first[prompt_token].decoded_token == tok.decode([prompt_token])
    assert out.outputs[0].cumulative_logprob == pytest.approx(
        sum(e[t].logprob for e, t in zip(out.outputs[0].logprobs, out.outputs[0].token_ids))
    )


def test_rank_of_a_token_outside_the_requested_top_k(llm):
    """Sampled and prompt tokens that miss the top-1 still carry their exact rank:
    the oracle is the same seeded request asking for the whole vocabulary."""
    prompt = "def f(x):\n    return"
    params = dict(temperature=5.0, seed=11, max_tokens=8, ignore_eos=True)
    small = llm.generate(prompt, SamplingParams(**params, logprobs=1, prompt_logprobs=1), use_tqdm=False)[0]
    full = llm.generate(prompt, SamplingParams(**params, logprobs=-1, prompt_logprobs=-1), use_tqdm=False)[0]
    assert small.outputs[0].token_ids == full.outputs[0].token_ids

    def exact_rank(entry, token):
        return 1 + sum(lp.logprob > entry[token].logprob for lp in entry.values())

    pairs = list(zip(small.outputs[0].token_ids, small.outputs[0].logprobs, full.outputs[0].logprobs))
    pairs += list(zip(small.prompt_token_ids[1:], small.prompt_logprobs[1:], full.prompt_logprobs[1:]))
    outside = [(t, s, f) for t, s, f in pairs if exact_rank(f, t) > 1]
    assert len(outside) >= 3  # temperature 5 and a random model: many picks miss the top-1
    for token, entry, whole in pairs:
        assert entry[token].rank == exact_rank(whole, token)
        assert entry[token].logprob == pytest.approx(whole[token].logprob, abs=1e-5)


def test_logprobs_minus_one_is_the_whole_vocabulary(llm, llama_dir):
    out = llm.generate("x = ", SamplingParams(**GREEDY, logprobs=-1), use_tqdm=False)[0]
    entry = out.outputs[0].logprobs[0]
    assert len(entry) == llm.cfg.hf_config.vocab_size
    assert math.log(sum(math.exp(lp.logprob) for lp in entry.values())) == pytest.approx(0.0, abs=1e-4)
    assert sorted(lp.rank for lp in entry.values()) == list(range(1, len(entry) + 1))
    capped = LLM(str(llama_dir), dtype="float32", max_logprobs=5, num_gpu_blocks_override=16)
    with pytest.raises(ValueError, match="logprobs=-1.*max_logprobs=5"):
        capped.generate("x", SamplingParams(logprobs=-1), use_tqdm=False)


def test_num_cached_tokens_and_reset_prefix_cache(llm):
    params = SamplingParams(**GREEDY)
    first = llm.generate(LONG, params, use_tqdm=False)[0]
    again = llm.generate(LONG, params, use_tqdm=False)[0]
    full_blocks = (len(first.prompt_token_ids) - 1) // 4 * 4
    assert again.num_cached_tokens == full_blocks > 0
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert llm.reset_prefix_cache() is True
    assert llm.generate(LONG, params, use_tqdm=False)[0].num_cached_tokens == 0


def test_detokenize_false_keeps_tokens_and_drops_text(llm):
    with_text = llm.generate("def f(x):", SamplingParams(**GREEDY), use_tqdm=False)[0].outputs[0]
    no_text = llm.generate("def f(x):", SamplingParams(**GREEDY, detokenize=False), use_tqdm=False)[0].outputs[0]
    assert with_text.text and no_text.text == ""
    assert no_text.token_ids == with_text.token_ids
    with pytest.raises(ValueError, match="stop strings need detokenize"):
        SamplingParams(detokenize=False, stop=["x"])


def test_truncate_prompt_tokens_keeps_the_tail(llm):
    ids = llm.get_tokenizer().encode(LONG)
    cut = llm.generate(LONG, SamplingParams(**GREEDY, truncate_prompt_tokens=6), use_tqdm=False)[0]
    tail = llm.generate(TokensPrompt(prompt_token_ids=ids[-6:]), SamplingParams(**GREEDY), use_tqdm=False)[0]
    assert cut.prompt_token_ids == ids[-6:]
    assert cut.outputs[0].token_ids == tail.outputs[0].token_ids
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):
        SamplingParams(truncate_prompt_tokens=0)


def test_per_request_logits_processors_touch_only_their_rows(llm):
    seen: list[list[int]] = []

    def force_token_9(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        seen.append(list(output_ids))
        forced = torch.full_like(logits, float("-inf"))
        forced[9] = 0.0
        return forced

    plain = SamplingParams(**GREEDY)
    custom = SamplingParams(**GREEDY, logits_processors=[force_token_9])
    baseline = llm.generate(["def f(x):"], plain, use_tqdm=False)[0]
    mixed = llm.generate([TextPrompt(prompt="def f(x):"), "def f(x):"], [custom, plain], use_tqdm=False)
    assert mixed[0].outputs[0].token_ids == [9] * 5
    assert mixed[1].outputs[0].token_ids == baseline.outputs[0].token_ids
    assert seen == [[9] * i for i in range(5)]
    with pytest.raises(ValueError, match="logits_processors"):
        SamplingParams(logits_processors=[3])


def test_get_metrics_counts_with_vllm_names(llm):
    before = {m.name: m.value for m in llm.get_metrics()}
    outs = llm.generate(["a", "bc"], SamplingParams(**GREEDY), use_tqdm=False)
    after = {m.name: m.value for m in llm.get_metrics()}
    assert after["vllm:prompt_tokens"] - before["vllm:prompt_tokens"] == sum(len(o.prompt_token_ids) for o in outs)
    assert after["vllm:generation_tokens"] - before["vllm:generation_tokens"] == 10
    assert after["vllm:request_success"] - before["vllm:request_success"] == 2
    assert after["vllm:num_requests_running"] == 0


def test_logits_processors_that_cannot_leave_the_process_are_refused_up_front():
    from minivllm.sample.logits_processors import check_picklable

    check_picklable(SamplingParams(logits_processors=[keep_logits]))  # a module-level function pickles
    with pytest.raises(ValueError, match="logits_processors: must be picklable"):
        check_picklable(SamplingParams(logits_processors=[lambda ids, logits: logits]))


def keep_logits(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    return logits
