"""The incremental detokenizer: text equal to decoding the whole sequence, stop strings
across token boundaries, held-back streaming text, min_tokens, and special tokens."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.engine.parent_request import CompletionState, ParentRequest
from minivllm.outputs import EngineCoreOutput
from minivllm.request import RequestId
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


CODE = "    return self.data\n"
EOS = 2


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def _feed(tok, params: SamplingParams, text: str = CODE, prompt: str = "def f():\n"):
    """Feed ``text``'s tokens one by one; returns (detokenizer, per-token stop results, shown texts)."""
    detok = IncrementalDetokenizer(tok, params, tok.encode(prompt, add_special_tokens=False))
    stops, shown = [], []
    for token in tok.encode(text, add_special_tokens=False):
        stops.append(detok.append([token]))
        shown.append(detok.output_text(finished=stops[-1] is not None))
        if stops[-1] is not None:
            break
    return detok, stops, shown


def test_tokens_are_what_the_tests_assume(tok):
    pieces = [tok.decode([t]) for t in tok.encode(CODE, add_special_tokens=False)]
    assert pieces[:4] == ["   ", " return", " self", "."]


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_split_across_tokens(tok, include):
    # "rn se" spans " return" and " self": it completes only when " self" arrives
    detok, stops, _ = _feed(tok, SamplingParams(stop=["rn se"], include_stop_str_in_output=include))
    assert stops == [None, None, "rn se"]
    assert detok.text == ("    return se" if include else "    retu")


def test_stop_string_across_three_tokens_and_first_completed_wins(tok):
    detok, stops, _ = _feed(tok, SamplingParams(stop=["n self.da", "f."]))
    assert stops == [None, None, None, "f."] and detok.text == "    return sel"  # "f." completes first
    # both complete with ".": the one that starts earlier is the match
    detok, stops, _ = _feed(tok, SamplingParams(stop=["lf.", "return self."]))
    assert stops == [None, None, None, "return self."] and detok.text == "    "


def test_no_stop_means_whole_text(tok):
    detok, stops, _ = _feed(tok, SamplingParams(stop=["zzz"]))
    assert set(stops) == {None} and detok.text == CODE


def test_stop_strings_wait_for_min_tokens(tok):
    detok, stops, _ = _feed(tok, SamplingParams(stop=["ret"], min_tokens=2), text=CODE + "return x")
    assert stops[-1] == "ret" and len(stops) == 10  # the first "ret" came with token 2, inside min_tokens
    assert detok.text == CODE


@pytest.mark.parametrize("include", [False, True])
def test_streamed_text_never_shows_a_stop_string_and_only_grows(tok, include):
    stop = "self.d"
    _, stops, shown = _feed(tok, SamplingParams(stop=[stop], include_stop_str_in_output=include))
    assert stops[-1] == stop
    for before, after in zip(shown, shown[1:]):
        assert after.startswith(before)  # nothing once shown is taken back
    assert all(stop not in s for s in shown[:-1])
    assert shown[-1] == ("    return self.d" if include else "    return ")


def test_special_tokens_skipped_or_spaced(tok):
    ids = tok.encode("x = 1", add_special_tokens=False)
    sequence = ids + [EOS] + ids + [EOS, EOS]
    results = {}
    for skip in (True, False):
        for spaces in (True, False):
            params = SamplingParams(skip_special_tokens=skip, spaces_between_special_tokens=spaces)
            detok = IncrementalDetokenizer(tok, params, tok.encode("y", add_special_tokens=False))
            detok.append(sequence)
            results[skip, spaces] = detok.text
    assert results[True, True] == results[True, False] == "x = 1x = 1"
    assert results[False, False] == "x = 1</s>x = 1</s></s>"
    # transformers' Python tokenizers join the pieces around added tokens with single spaces
    assert results[False, True] == "x = 1 </s> x = 1 </s> </s>"


def test_split_multibyte_character_is_held_until_complete(tok):
    ids = tok.encode("é!", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, SamplingParams(), tok.encode("a", add_special_tokens=False))
    texts = []
    for t in ids:
        detok.append([t])
        texts.append(detok.text)
    assert len(ids) > 2 and texts[0] == "" and texts[-1] == "é!"


def test_a_stop_string_inside_a_several_token_output_ends_the_completion_there(tok):
    """Several tokens in one output (accepted drafts, multi-step decoding): a stop string that
    ends at one of them ends the completion at that token, as one token a step would, with
    its logprobs; the core's own finish at the same token keeps its reason."""
    params = SamplingParams(stop=["STOP"])
    ids = tok.encode("alpha beta STOPgamma delta", add_special_tokens=False)
    probe = IncrementalDetokenizer(tok, params, [])
    end = next(i for i, t in enumerate(ids) if probe.append([t]) is not None) + 1  # through the stop's last token
    assert end < len(ids)

    def completion():
        parent = ParentRequest(RequestId("r"), None, [], params)
        return CompletionState(RequestId("r"), 0, parent, IncrementalDetokenizer(tok, params, []))

    state = completion()
    logprobs = [{t: -0.5, 7: -2.0} for t in ids]
    assert state.append_output(EngineCoreOutput(RequestId("r"), ids, logprobs)) is True  # abort the core request
    assert state.token_ids == ids[:end] and (state.finish_reason, state.stop_reason) == ("stop", "STOP")
    assert len(state.logprobs) == end and state.cumulative_logprob == pytest.approx(-0.5 * end)
    assert state.output(delta=False).text == "alpha beta "
    state = completion()  # the core finished at the output's last token: the earlier stop string wins
    assert state.append_output(EngineCoreOutput(RequestId("r"), ids, None, "length")) is False
    assert state.token_ids == ids[:end] and state.finish_reason == "stop"
    state = completion()  # both at the same token: the core's reason, as with one token a step
    assert state.append_output(EngineCoreOutput(RequestId("r"), ids[:end], None, "length")) is False
    assert state.token_ids == ids[:end] and state.finish_reason == "length"
