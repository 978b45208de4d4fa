"""End to end through the engine: stop strings, the three output kinds with n > 1,
and the SamplingParams checks that need the model."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from minivllm.sampling_params import RequestOutputKind

PROMPT = "def parse(self, text):\n    "


@pytest.fixture(scope="module")
def llm(llama_dir):
    engine = LLM(model=str(llama_dir), dtype="float32", block_size=8, num_gpu_blocks_override=64, max_logprobs=5)
    yield engine
    engine.shutdown()


def _greedy(llm, **kwargs):
    return llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=10, **kwargs), use_tqdm=False)[0].outputs[0]


def _boundary_stop(llm, token_ids: list[int]) -> tuple[str, int, int]:
    """A two-character stop string made of the last character of one output token's text and
    the first of the next one's, found nowhere earlier: (stop, where it starts, tokens up to it)."""
    tok = llm.get_tokenizer()
    for b in range(1, len(token_ids) - 1):
        cut = len(tok.decode(token_ids[: b + 1]))
        text = tok.decode(token_ids[: b + 2])
        stop = text[cut - 1 : cut + 1]
        if _plain_chars(stop) and text.find(stop) == cut - 1 and "\ufffd" not in text[cut - 2 :]:
            return stop, cut - 1, b + 2
    pytest.fail("no token boundary with printable text on both sides")


def _plain_chars(text: str) -> bool:
    """Two printable characters, neither a stand-in for bytes of an unfinished character."""
    return len(text) == 2 and text.isprintable() and "\ufffd" not in text


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_split_across_output_tokens(llm, include):
    plain = _greedy(llm)
    stop, at, num_tokens = _boundary_stop(llm, plain.token_ids)
    out = _greedy(llm, stop=[stop], include_stop_str_in_output=include)
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.token_ids == plain.token_ids[:num_tokens]  # generation ended with the completing token
    assert out.text == (plain.text[: at + len(stop)] if include else plain.text[:at])


def _stream(llm, kind: RequestOutputKind, stop: list[str]):
    engine = llm.llm_engine
    params = SamplingParams(
        n=2, temperature=1.0, seed=5, max_tokens=10, stop=stop, prompt_logprobs=1, logprobs=1, output_kind=kind
    )
    engine.add_request("stream", PROMPT, params)
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(engine.step())
    return outs


def test_output_kinds_agree_with_each_other(llm):
    unstopped = _stream(llm, RequestOutputKind.FINAL_ONLY, stop=[])[0].outputs[0].text
    stop = next(unstopped[i : i + 2] for i in range(4, len(unstopped)) if _plain_chars(unstopped[i : i + 2]))
    final = _stream(llm, RequestOutputKind.FINAL_ONLY, [stop])
    assert len(final) == 1 and final[0].finished
    expected = {c.index: c for c in final[0].outputs}
    assert sorted(expected) == [0, 1] and expected[0].token_ids != expected[1].token_ids
    assert expected[0].finish_reason == "stop" and expected[0].text == unstopped[: unstopped.index(stop)]
    assert len(final[0].prompt_logprobs) == len(final[0].prompt_token_ids)

    cumulative = _stream(llm, RequestOutputKind.CUMULATIVE, [stop])
    assert len(cumulative) > 1 and cumulative[-1].finished and not cumulative[0].finished
    for before, after in zip(cumulative, cumulative[1:]):
        assert [c.index for c in after.outputs] == [0, 1]
        for b, a in zip(before.outputs, after.outputs):
            assert a.text.startswith(b.text) and a.token_ids[: len(b.token_ids)] == b.token_ids
            assert stop not in a.text
    assert cumulative[-1].outputs == final[0].outputs
    assert all(o.prompt_logprobs == final[0].prompt_logprobs for o in cumulative)

    delta = _stream(llm, RequestOutputKind.DELTA, [stop])
    assert delta[-1].finished and not any(o.finished for o in delta[:-1])
    for index, want in expected.items():
        parts = [c for o in delta for c in o.outputs if c.index == index]
        assert "".join(c.text for c in parts) == want.text
        assert sum((c.token_ids for c in parts), []) == want.token_ids
        assert sum((c.logprobs for c in parts), []) == want.logprobs
        assert parts[-1].finish_reason == want.finish_reason
    with_prompt_logprobs = [o for o in delta if o.prompt_logprobs is not None]
    assert len(with_prompt_logprobs) == 1 and with_prompt_logprobs[0] is delta[0]


BAD_REQUESTS = [
    (SamplingParams(logprobs=6), "logprobs=6: must be in [0, 5] (model.max_logprobs=5)"),
    (SamplingParams(prompt_logprobs=9), "prompt_logprobs=9: must be in [0, 5]"),
    (SamplingParams(logit_bias={512: 1.0}), "logit_bias: token ids [512] outside the vocabulary [0, 512)"),
    (SamplingParams(allowed_token_ids=[3, 600]), "allowed_token_ids: token ids [600] outside the vocabulary"),
    (SamplingParams(stop_token_ids=[512]), "stop_token_ids: token ids [512] outside the vocabulary"),
]


@pytest.mark.parametrize("bad, message", BAD_REQUESTS, ids=[m.split(":")[0] for _, m in BAD_REQUESTS])
def test_model_dependent_checks_fail_before_any_work(llm, bad, message):
    with pytest.raises(ValueError) as err:
        llm.generate(["import os", PROMPT], [SamplingParams(max_tokens=2), bad], use_tqdm=False)
    assert message in str(err.value)
    assert not llm.llm_engine.has_unfinished_requests()  # the good request was not queued either
    assert len(llm.generate(PROMPT, SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids) == 2


def test_bad_words_tokenisation(llm):
    tok = llm.get_tokenizer()
    params = llm.llm_engine.processor.prepare_params(SamplingParams(bad_words=["self", " return x"]), eos_token_id=2)
    bare, spaced = tok.encode("self", add_special_tokens=False), tok.encode(" self", add_special_tokens=False)
    assert len(bare) == len(spaced) == 1 and bare != spaced  # both forms of the word are banned
    assert params._bad_words_token_ids[:2] == [bare, spaced]
    assert tok.encode("return x", add_special_tokens=False) in params._bad_words_token_ids
    assert params._all_stop_token_ids == {2}
    assert llm.llm_engine.processor.prepare_params(SamplingParams(ignore_eos=True), 2)._all_stop_token_ids == set()
