"""Structured outputs through ``LLM.generate`` on the demo model, whose unconstrained
text is never valid JSON: a pass means the constraint did it."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from minivllm import LLM, SamplingParams
from minivllm.structured_output import GuidedDecodingParams, StructuredOutputsParams
from minivllm.tokenizer import DEMO_TOKENIZER

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "zip": {"type": "string", "pattern": "[0-9]{3}"},
            },
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
}
PROMPTS = [
    "The weather today",
    "Once upon a time",
    "def fib(n):",
    "Hello",
    "import numpy as np",
    "The capital of",
    "In 1969,",
    "Dear sir,",
    "class Node:",
    "for i in range(10):",
    "My favourite food",
    "The answer is",
    "SELECT * FROM",
    "Q: what is 2+2?",
    "The quick brown fox",
    "return x",
    "# Title",
    "She said",
    "x = [",
    "Why",
]
DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"


@pytest.fixture(scope="module")
def llm():
    engine = LLM(
        str(DEMO_TOKENIZER), dtype="float32", device="cpu", block_size=8, num_gpu_blocks_override=1024, max_num_seqs=64
    )
    yield engine
    engine.shutdown()


def _texts(llm: LLM, prompts: list[str], **params) -> list[str]:
    outs = llm.generate(prompts, SamplingParams(**params), use_tqdm=False)
    return [c.text for o in outs for c in o.outputs]


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def test_unconstrained_demo_text_is_not_json(llm):
    texts = _texts(llm, PROMPTS, temperature=1.0, seed=0, max_tokens=40)
    assert not any(_parses(t) for t in texts)


def test_json_schema_validates_for_20_prompts_and_several_seeds(llm):
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)  # compact: short documents, a fast test
    params = [SamplingParams(temperature=1.0, seed=i % 3, max_tokens=100, structured_outputs=so) for i in range(20)]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for out in outs:
        c = out.outputs[0]
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), SCHEMA)
    assert len({o.outputs[0].text for o in outs}) > 10  # sampled, not one fixed document


def test_json_schema_with_free_whitespace(llm):
    params = SamplingParams(
        temperature=1.0, seed=8, max_tokens=200, structured_outputs=StructuredOutputsParams(json=SCHEMA)
    )
    for out in llm.generate(PROMPTS[:2], params, use_tqdm=False):
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)


def test_regex_matches_fully(llm):
    for text in _texts(
        llm, PROMPTS[:8], temperature=1.0, seed=3, max_tokens=20, structured_outputs=StructuredOutputsParams(regex=DATE)
    ):
        assert re.fullmatch(DATE, text), text
    ident = r"[A-Za-z_][A-Za-z0-9_]{2,9}"
    for text in _texts(
        llm, PROMPTS[:8], temperature=0.0, max_tokens=20, structured_outputs=StructuredOutputsParams(regex=ident)
    ):
        assert re.fullmatch(ident, text), text


def test_choice_returns_exactly_one_choice(llm):
    choices = ["yes", "no", "maybe not"]
    texts = _texts(
        llm, PROMPTS, temperature=1.0, seed=4, max_tokens=10, structured_outputs=StructuredOutputsParams(choice=choices)
    )
    assert set(texts) <= set(choices) and len(set(texts)) > 1


def test_json_object_and_ebnf_grammar(llm):
    # Any object: the model may write a string until max_tokens, so only finished ones must parse.
    params = SamplingParams(
        temperature=1.0, seed=5, max_tokens=120, structured_outputs=StructuredOutputsParams(json_object=True)
    )
    done = [
        o.outputs[0].text
        for o in llm.generate(PROMPTS[:8], params, use_tqdm=False)
        if o.outputs[0].finish_reason == "stop"
    ]
    assert len(done) >= 6
    assert all(isinstance(json.loads(text), dict) for text in done)
    grammar = 'root ::= "(" expr ")"\nexpr ::= [0-9] | [0-9] "+" expr'
    for text in _texts(
        llm,
        PROMPTS[:6],
        temperature=1.0,
        seed=6,
        max_tokens=30,
        structured_outputs=StructuredOutputsParams(grammar=grammar),
    ):
        assert re.fullmatch(r"\([0-9](\+[0-9])*\)", text), text


def test_n2_seed_logprobs_and_the_older_guided_decoding_name(llm):
    params = SamplingParams(
        n=2,
        temperature=1.0,
        seed=7,
        max_tokens=100,
        logprobs=2,
        guided_decoding=GuidedDecodingParams(json=SCHEMA, disable_any_whitespace=True),
    )
    first = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    again = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    for out, out2 in zip(first, again):
        assert len(out.outputs) == 2
        for c, c2 in zip(out.outputs, out2.outputs):
            jsonschema.validate(json.loads(c.text), SCHEMA)
            assert c.token_ids == c2.token_ids  # seeded: the same whatever else ran
            assert len(c.logprobs) == len(c.token_ids) and all(t in lp for t, lp in zip(c.token_ids, c.logprobs))


def test_bad_constraints_are_refused_before_any_work(llm):
    cases = {
        "structured_outputs.regex": dict(regex="(unclosed"),
        "structured_outputs.grammar": dict(grammar='root ::= "a'),
        "structured_outputs.json": dict(json={"type": 3}),
        "structured_outputs: set exactly one": dict(regex="a", choice=["a"]),
        "structured_outputs.choice": dict(choice=[]),
    }
    for message, kwargs in cases.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            llm.generate("Hi", SamplingParams(structured_outputs=StructuredOutputsParams(**kwargs)), use_tqdm=False)
    with pytest.raises(ValueError, match="multi_modal_data"):
        llm.generate({"prompt": "Hi", "multi_modal_data": {"image": b""}}, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert _texts(
        llm, ["Hi"], temperature=0.0, max_tokens=4, structured_outputs=StructuredOutputsParams(choice=["ok"])
    ) == ["ok"]


def test_preemption_and_prefix_caching_do_not_change_constrained_output(llm):
    """Seeded requests give the same tokens whatever else runs: a cache so small that
    requests are preempted and recomputed (with prefix caching on) must not feed
    any matcher a token twice, or the output would differ or break."""
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    params = SamplingParams(temperature=1.0, seed=9, max_tokens=100, structured_outputs=so)
    prompts = [p + " and so on, as we said before" for p in PROMPTS[:5]]
    expected = _texts(llm, prompts, **vars_of(params))
    small = LLM(
        str(DEMO_TOKENIZER),
        dtype="float32",
        device="cpu",
        block_size=8,
        num_gpu_blocks_override=24,
        enable_prefix_caching=True,
    )
    try:
        got = _texts(small, prompts, **vars_of(params))
        assert small.llm_engine.core.scheduler.num_preemptions > 0
    finally:
        small.shutdown()
    assert got == expected
    for text in got:
        jsonschema.validate(json.loads(text), SCHEMA)


def vars_of(params: SamplingParams) -> dict:
    return dict(
        temperature=params.temperature,
        seed=params.seed,
        max_tokens=params.max_tokens,
        structured_outputs=params.structured_outputs,
    )


def test_async_scheduling_keeps_every_constraint(llm):
    """Async scheduling (CUDA's default with one worker) must send the grammar bitmask: it once
    counted the step's placeholder before choosing the requests that sample, sent no mask,
    and the first token broke the grammar ("stop" after one off-grammar token)."""
    choice = SamplingParams(
        temperature=1.0,
        seed=4,
        max_tokens=10,
        structured_outputs=StructuredOutputsParams(choice=["yes", "no", "maybe not"]),
    )
    json_params = SamplingParams(
        temperature=1.0,
        seed=9,
        max_tokens=100,
        structured_outputs=StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True),
    )
    expected = [_texts(llm, PROMPTS[:6], **vars_of(p)) for p in (choice, json_params)]
    overlapped = LLM(
        str(DEMO_TOKENIZER),
        dtype="float32",
        device="cpu",
        block_size=8,
        num_gpu_blocks_override=1024,
        overrides=["scheduler.async_scheduling=true"],
    )
    try:
        assert overlapped.cfg.async_scheduling
        got = [_texts(overlapped, PROMPTS[:6], **vars_of(p)) for p in (choice, json_params)]
    finally:
        overlapped.shutdown()
    assert got == expected
    assert set(got[0]) <= {"yes", "no", "maybe not"}
    for text in got[1]:
        jsonschema.validate(json.loads(text), SCHEMA)
