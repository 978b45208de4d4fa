"""Incremental detokenization agrees with decoding the whole sequence."""
from __future__ import annotations

from transformers import AutoTokenizer

from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.sampling_params import SamplingParams

TEXT = 'def naïve(x):\n    return "héllo — wörld" + str(x)  # ✓ done\n'


def test_token_by_token_text_equals_full_decode(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    prompt = tok.encode("print(")
    ids = tok.encode(TEXT)
    detok = IncrementalDetokenizer(tok, SamplingParams(), prompt)
    for t in ids:
        detok.append([t])
    assert detok.text == tok.decode(ids) == TEXT


def test_stop_string_split_across_tokens_is_trimmed(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tok.encode("alpha beta STOPgamma")
    for keep, expected in ((False, "alpha beta "), (True, "alpha beta STOP")):
        detok = IncrementalDetokenizer(tok, SamplingParams(stop=["STOP"], include_stop_str_in_output=keep), [])
        matched = None
        for t in ids:
            matched = detok.append([t]) or matched
            if matched:
                break
        assert matched == "STOP"
        assert detok.text == expected
