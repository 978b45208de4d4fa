"""JSON-schema output is strict JSON: no raw control character (U+0000-U+001F) inside a
string, length-bounded strings included (xgrammar's own rule for those lets them in).

The allowed-token masks are checked against the tokenizer's own decoding of each
token, and a random model (which samples control-character tokens often, unlike the
trained demo model) must write output that strict ``json.loads`` accepts."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import xgrammar as xgr
from transformers import AutoTokenizer

from minivllm import LLM, SamplingParams
from minivllm.structured_output import StructuredOutputsParams
from minivllm.structured_output.backend import XGrammarBackend, strict_string_grammar
from minivllm.tokenizer import DEMO_TOKENIZER

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}
BOUNDED = [
    # (schema, compact, text that opens a bounded string)
    (PERSON, False, '{"name": "ab'),
    (PERSON, True, '{"name":"ab'),
    ({"type": "array", "items": {"type": ["string", "null"], "minLength": 2, "maxLength": 5}}, True, '["a'),
    ({"type": "object", "propertyNames": {"maxLength": 6}}, True, '{"k'),
]


@pytest.fixture(scope="module")
def demo():
    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_TOKENIZER))
    return tokenizer, XGrammarBackend(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def _allowed_after(backend: XGrammarBackend, schema: dict, compact: bool, text: str) -> list[int]:
    matcher = backend.matcher(backend.compile(StructuredOutputsParams(json=schema, disable_any_whitespace=compact)))
    assert matcher.accept_string(text)
    bitmask = backend.allocate_bitmask(1)
    matcher.fill_next_token_bitmask(bitmask, 0)
    row = bitmask.numpy()[0].view(np.uint32)
    return [t for t in range(backend.vocab_size) if (int(row[t // 32]) >> (t % 32)) & 1]


@pytest.mark.parametrize("schema,compact,text", BOUNDED, ids=["any-whitespace", "compact", "union", "property-names"])
def test_a_bounded_string_allows_no_control_character_token(demo, schema, compact, text):
    tokenizer, backend = demo
    allowed = _allowed_after(backend, schema, compact, text)
    controls = [t for t in allowed if any(ord(ch) < 0x20 for ch in tokenizer.decode([t]))]
    assert not controls, [tokenizer.convert_ids_to_tokens(t) for t in controls]
    words = tokenizer.encode("cd", add_special_tokens=False)
    assert words[0] in allowed  # ordinary text still is


def test_the_bound_and_the_rest_of_the_grammar_are_unchanged():
    unbounded = {"type": "object", "properties": {"x": {"type": "string"}, "n": {"enum": ["a\tb", 1]}}}
    assert str(strict_string_grammar(json.dumps(unbounded))) == str(xgr.Grammar.from_json_schema(json.dumps(unbounded)))
    before = str(xgr.Grammar.from_json_schema(json.dumps(PERSON))).splitlines()
    after = str(strict_string_grammar(json.dumps(PERSON))).splitlines()
    changed = [(b, a) for b, a in zip(before, after) if b != a]
    assert len(before) == len(after) and len(changed) == 1 and "{0, 8}" in "\n".join(after)
    tokenizer_free = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1)
    grammar = tokenizer_free.compile_grammar(strict_string_grammar(json.dumps(PERSON)))
    matcher = xgr.GrammarMatcher(grammar, terminate_without_stop_token=True)
    assert matcher.accept_string('{"name": "abé中", "age": 3}') and matcher.is_terminated()
    for text in ('{"name": "a\tb"', '{"name": "a\x15', '{"name": "abcdefghi'):
        matcher.reset()
        assert not matcher.accept_string(text), repr(text)


def test_a_random_model_writes_strict_json_for_bounded_strings(llama_dir):
    """The random model samples control-character tokens often: without the narrowed
    rule about half of these 32 seeded documents do not parse strictly."""
    schema = {
        "type": "object",
        "properties": {"unit": {"enum": ["C", "F"]}, "city": {"type": "string", "maxLength": 10}},
        "required": ["unit", "city"],
    }
    so = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=40, structured_outputs=so) for i in range(32)]
    llm = LLM(str(llama_dir), dtype="float32", device="cpu", max_num_seqs=32, num_gpu_blocks_override=256)
    try:
        outs = llm.generate(["user: What is the weather in Paris?\nassistant:"] * 32, params, use_tqdm=False)
    finally:
        llm.shutdown()
    for out in outs:
        assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
        jsonschema.validate(json.loads(out.outputs[0].text), schema)  # strict: a raw control character fails
