"""SamplingParams validation: every bad value fails at construction, naming the field."""

from __future__ import annotations

import pytest

from minivllm.sampling_params import RequestOutputKind, SamplingParams

BAD = [
    ({"n": 0}, "n=0: must be in [1, inf)"),
    ({"n": -2}, "n=-2"),
    ({"n": 1.5}, "n=1.5: must be a number (an integer)"),
    ({"temperature": -0.1}, "temperature=-0.1: must be in [0.0, inf)"),
    ({"top_p": 0.0}, "top_p=0.0: must be in (0.0, 1.0]"),
    ({"top_p": 1.1}, "top_p=1.1"),
    ({"top_k": -2}, "top_k=-2: must be -1 (disable), 0 (disable) or at least 1"),
    ({"min_p": -0.1}, "min_p=-0.1: must be in [0.0, 1.0]"),
    ({"min_p": 1.5}, "min_p=1.5: must be in [0.0, 1.0]"),
    ({"presence_penalty": 2.5}, "presence_penalty=2.5: must be in [-2.0, 2.0]"),
    ({"presence_penalty": -3}, "presence_penalty=-3"),
    ({"frequency_penalty": -2.1}, "frequency_penalty=-2.1: must be in [-2.0, 2.0]"),
    ({"repetition_penalty": 0.0}, "repetition_penalty=0.0: must be in (0.0, inf)"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty=inf: must be a finite number"),
    ({"repetition_penalty": float("nan")}, "repetition_penalty=nan: must be a finite number"),
    ({"temperature": float("inf")}, "temperature=inf: must be a finite number"),
    ({"max_tokens": 0}, "max_tokens=0: must be in [1, inf)"),
    ({"min_tokens": -1}, "min_tokens=-1: must be in [0, inf)"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens=5: must be at most max_tokens=4"),
    ({"logprobs": -2}, "logprobs=-2: must be in [0, inf)"),
    ({"prompt_logprobs": -2}, "prompt_logprobs=-2"),
    ({"seed": "7"}, "seed='7': must be a number (an integer or None)"),
    ({"stop": 5}, "stop=5: must be a non-empty string or a list of non-empty strings"),
    ({"stop": ["ok", 3]}, "stop=['ok', 3]"),
    ({"stop": [""]}, "stop=['']"),
    ({"stop_token_ids": [-1]}, "stop_token_ids=[-1]: must be a list of token ids"),
    ({"stop_token_ids": "2"}, "stop_token_ids='2'"),
    ({"bad_words": [1]}, "bad_words=[1]: must be a non-empty string or a list of non-empty strings"),
    ({"allowed_token_ids": []}, "allowed_token_ids=[]: must hold at least one token id"),
    ({"allowed_token_ids": [1, -4]}, "allowed_token_ids=[1, -4]"),
    ({"logit_bias": [1, 2]}, "logit_bias=[1, 2]: must be a dict of token id -> bias"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias: key -1 must be a token id"),
    ({"logit_bias": {"x": 1.0}}, "logit_bias: key 'x' must be a token id"),
    ({"logit_bias": {3: "big"}}, "logit_bias[3]='big': must be a finite number"),
    ({"logit_bias": {3: float("inf")}}, "logit_bias[3]=inf"),
    ({"output_kind": "sometimes"}, "output_kind='sometimes': must be one of RequestOutputKind.CUMULATIVE"),
]


@pytest.mark.parametrize("kwargs, message", BAD, ids=[next(iter(k)) + "-" + str(i) for i, (k, _) in enumerate(BAD)])
def test_bad_value_raises_naming_the_field(kwargs, message):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert message in str(err.value)


def test_normalised_values():
    p = SamplingParams(stop="###", bad_words="foo", logit_bias={"17": 250, 3: -1e9}, output_kind="delta")
    assert p.stop == ["###"]
    assert p.bad_words == ["foo"]
    assert p.logit_bias == {17: 100.0, 3: -100.0}  # JSON keys become ids; biases clamp like vLLM/OpenAI
    assert p.output_kind is RequestOutputKind.DELTA
    assert not p.needs_penalties
    assert SamplingParams(repetition_penalty=1.2).needs_penalties
    assert SamplingParams(presence_penalty=-0.5).needs_penalties


def test_clone_is_independent():
    p = SamplingParams(logit_bias={1: 1.0}, stop=["a"])
    q = p.clone()
    q.logit_bias[2] = 2.0
    q.stop.append("b")
    assert p.logit_bias == {1: 1.0} and p.stop == ["a"]
