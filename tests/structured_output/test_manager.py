"""The scheduler's side of structured outputs with the real xgrammar backend on the
demo tokenizer: compiles off the step loop, cached per constraint; bitmask rows for
the step's sampling requests; matchers that never see a token twice."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from transformers import AutoTokenizer

from minivllm.outputs import ModelRunnerOutput
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output import StructuredOutputsParams
from minivllm.structured_output.backend import XGrammarBackend
from minivllm.structured_output.manager import StructuredOutputManager
from minivllm.tokenizer import DEMO_TOKENIZER
from tests.core.scheduler_helpers import base_config, make_request, make_scheduler

EOS = 2


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(DEMO_TOKENIZER))


class GatedBackend(XGrammarBackend):
    """Compiles only once ``gate`` is set; counts compiles."""

    def __init__(self, tokenizer, vocab_size: int = 2048) -> None:
        super().__init__(tokenizer, vocab_size, [EOS])
        self.gate = threading.Event()
        self.compiles = 0

    def compile(self, params):
        self.gate.wait(30)
        self.compiles += 1
        return super().compile(params)


def _scheduler(backend: XGrammarBackend):
    sched = make_scheduler(base_config(), num_blocks=64, block_size=4)
    sched.structured = sched.admission.structured = StructuredOutputManager(lambda: backend)
    return sched


def _constrained(tokens: list[int], so: StructuredOutputsParams, max_tokens: int = 8):
    request = make_request(tokens, max_tokens=max_tokens)
    request.sampling_params = SamplingParams(
        temperature=0, max_tokens=max_tokens, ignore_eos=True, structured_outputs=so
    )
    request.eos_token_id = EOS
    return request


def _allowed(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token // 32]) >> (token % 32)) & 1)


def test_a_request_waiting_for_its_grammar_lets_others_by(tokenizer):
    backend = GatedBackend(tokenizer)
    sched = _scheduler(backend)
    so = StructuredOutputsParams(choice=["ab"])
    first, second = _constrained([5, 6, 7], so), _constrained([8, 9], so)
    plain = make_request([10, 11, 12])
    for r in (first, second, plain):
        sched.add_request(r)
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == [plain.request_id] and out.grammar_bitmask is None
    assert [r.request_id for r in sched.waiting] == [first.request_id, second.request_id]  # order kept
    backend.gate.set()
    sched.structured._cache[so.key()].result(timeout=30)
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == [plain.request_id, first.request_id, second.request_id]
    assert backend.compiles == 1  # one compile for the shared constraint
    assert out.structured_output_request_ids == [first.request_id, second.request_id]
    a, b = tokenizer.convert_tokens_to_ids(["a", "b"])
    for row in out.grammar_bitmask:
        assert _allowed(row, a) and not _allowed(row, b) and not _allowed(row, EOS)


def test_matcher_sees_each_token_once_and_its_end_stops_the_request(tokenizer):
    backend = GatedBackend(tokenizer)
    backend.gate.set()
    sched = _scheduler(backend)
    a, b = tokenizer.convert_tokens_to_ids(["a", "b"])
    request = _constrained([5, 6, 7], StructuredOutputsParams(choice=["ab"]))
    sched.add_request(request)
    sched.structured._cache[request.sampling_params.structured_outputs.key()].result(timeout=30)
    for token in (a, b):
        out = sched.schedule()
        assert sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids={request.request_id: [token]}))
        assert not sched.structured.accept_tokens(request)  # already seen: a no-op, not a refusal
    out = sched.schedule()
    (row,) = out.grammar_bitmask
    allowed = [t for t in range(2048) if _allowed(row, t)]
    assert allowed == [EOS]  # the grammar is complete: only the stop token remains
    (result,) = sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids={request.request_id: [EOS]}))
    assert result.finish_reason == "stop"  # even with ignore_eos: the grammar ended
    assert not sched.structured.active


def test_vocab_padding_beyond_the_tokenizer_is_never_allowed(tokenizer):
    backend = XGrammarBackend(tokenizer, vocab_size=2048 + 64, stop_token_ids=[EOS])
    matcher = backend.matcher(backend.compile(StructuredOutputsParams(json_object=True)))
    bitmask = backend.allocate_bitmask(1)
    matcher.fill_next_token_bitmask(bitmask, 0)
    row = bitmask.numpy()[0]
    assert row.shape == ((2048 + 64) // 32,)
    assert _allowed(row, tokenizer.convert_tokens_to_ids("{"))
    assert not any(_allowed(row, t) for t in range(2048, 2048 + 64))


def test_the_compile_cache_keeps_the_most_recently_used(tokenizer, monkeypatch):
    from minivllm.structured_output import manager

    monkeypatch.setattr(manager, "CACHE_SIZE", 2)
    backend = GatedBackend(tokenizer)
    backend.gate.set()
    sched = _scheduler(backend)
    for choices in (["a"], ["b"], ["a"], ["c"], ["a"]):
        sched.add_request(_constrained([5], StructuredOutputsParams(choice=choices)))
    keys = [StructuredOutputsParams(choice=[c]).key() for c in "ca"]  # least recently used first
    assert list(sched.structured._cache) == keys
    for future in sched.structured._cache.values():
        future.result(timeout=30)
    assert backend.compiles == 3  # "a" once, then "b" and "c"


def test_a_grammar_that_fails_to_compile_aborts_its_request_through_the_outputs(tokenizer):
    class Failing(GatedBackend):
        def compile(self, params):
            raise RuntimeError("out of memory")

    sched = _scheduler(Failing(tokenizer))
    request = _constrained([5, 6], StructuredOutputsParams(choice=["ab"]))
    sched.add_request(request)
    sched.structured._cache[request.sampling_params.structured_outputs.key()].exception(timeout=30)
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == [request.request_id] and out.grammar_bitmask is None
    (result,) = sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids={request.request_id: [7]}))
    assert result.finish_reason == "abort" and not sched.has_unfinished_requests()
