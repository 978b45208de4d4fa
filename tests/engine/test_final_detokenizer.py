"""Final-only text decoded in one call equals the incremental detokenizer's text (the
oracle: what streaming the same tokens shows), for byte-level and metaspace tokenizers,
special and added tokens, ids past the vocabulary and unfinished characters."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from minivllm.engine.detokenizer import (
    FinalDetokenizer,
    FinalTextDecoder,
    IncrementalDetokenizer,
    wants_final_text_only,
)
from minivllm.sampling_params import RequestOutputKind, SamplingParams
from tests.checkpoints import SPECIAL, local_corpus

BYTE_PIECES = range(len(SPECIAL), len(SPECIAL) + 256)
"""The metaspace tokenizer's <0x..> byte-fallback pieces."""
PARAMS = [
    SamplingParams(),
    SamplingParams(skip_special_tokens=False),
    SamplingParams(skip_special_tokens=False, spaces_between_special_tokens=False),
    SamplingParams(spaces_between_special_tokens=False),
]


def _metaspace_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece-style tokenizer: metaspace pieces, byte fallback, a Sequence decoder."""
    tok = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"], byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback(), decoders.Fuse()])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=[*SPECIAL.values(), *bytes_], show_progress=False)
    tok.train_from_iterator(local_corpus(20_000), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL)


@pytest.fixture(scope="module")
def tokenizers(tokenizer_dir):
    byte_level = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    byte_level.add_tokens(["<tool>"])  # an added, non-special token: its own segment of text
    return {"byte_level": byte_level, "metaspace": _metaspace_tokenizer()}


def _incremental(tok, params: SamplingParams, prompt: list[int], out: list[int]) -> str:
    detok = IncrementalDetokenizer(tok, params, prompt)
    for t in out:
        detok.append([t])
    return detok.output_text(finished=True)


def _final(tok, params: SamplingParams, prompt: list[int], out: list[int]) -> str:
    detok = FinalDetokenizer(FinalTextDecoder(tok), params, prompt)
    for t in out:
        detok.append([t])
    return detok.output_text(finished=True)


@pytest.mark.parametrize("name", ["byte_level", "metaspace"])
def test_random_token_sequences_give_the_incremental_text(tokenizers, name):
    tok = tokenizers[name]
    vocab = len(tok)
    rng = np.random.default_rng(0)
    text = 'x = "naïve — ✓"\n    return héllo  '
    for trial in range(40):
        prompt = tok.encode("def f(" if trial % 2 else "é", add_special_tokens=False)
        if trial % 4 == 0:  # real text with multi-byte characters, cut anywhere
            out = tok.encode(text, add_special_tokens=False)[: int(rng.integers(1, 20))]
        else:  # any ids, special and added ones and ids past the vocabulary included
            out = rng.integers(0, vocab + 3, size=int(rng.integers(1, 24))).tolist()
            if name == "metaspace":  # random byte pieces can make the stream restart (the
                # last test), and then one call gives the tokenizer's own text instead
                out = [t for t in out if t not in BYTE_PIECES]
        for params in PARAMS:
            assert _final(tok, params, prompt, out) == _incremental(tok, params, prompt, out), (trial, out)


def test_only_final_only_requests_without_stop_strings_skip_streaming():
    final = RequestOutputKind.FINAL_ONLY
    assert wants_final_text_only(SamplingParams(output_kind=final))
    assert not wants_final_text_only(SamplingParams(output_kind=final, stop=["\n"]))
    assert not wants_final_text_only(SamplingParams(output_kind=final, detokenize=False))
    assert not wants_final_text_only(SamplingParams(output_kind=RequestOutputKind.DELTA))


def test_invalid_utf8_from_byte_pieces_restarts_the_stream_and_keeps_the_text(tokenizers):
    """Random byte-fallback pieces can make ``DecodeStream`` fail ("Invalid prefix"); the
    detokenizer starts a fresh stream at that token instead of failing the request: the
    text it had stays, and what follows is a fresh stream's text from that token on."""
    tok = tokenizers["metaspace"]
    # Streams that keep special text fail; no segments, so the restart is the only reset.
    params = SamplingParams(skip_special_tokens=False, spaces_between_special_tokens=False)
    rng = np.random.default_rng(0)
    restarted = 0
    for trial in range(100):
        prompt = tok.encode("def f(" if trial % 2 else "é", add_special_tokens=False)
        out = rng.integers(len(SPECIAL), len(tok), size=20).tolist()  # no added tokens (their own segments)
        detok = IncrementalDetokenizer(tok, params, prompt)
        for i, t in enumerate(out):
            stream, before = detok._stream, detok.text
            detok.append([t])
            if detok._stream is not stream:  # the stream failed at out[i] and restarted there
                restarted += 1
                fresh = IncrementalDetokenizer(tok, params, [])
                fresh.append(out[i:])
                detok.append(out[i + 1 :])
                assert detok.text == before + fresh.text, (trial, out)
                break
    assert restarted > 0  # the seeded sequences do hit the failure
