"""Batched logit edits (penalties, logit_bias, allowed/bad tokens, min_tokens) against
transformers' logits processors and hand-computed values, row by row in a mixed batch."""

from __future__ import annotations

import torch
from transformers.generation import (
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from minivllm.sample.logits_processors import LogitsEdits, TokenHistory, token_counts
from minivllm.sampling_params import SamplingParams
from tests.sample.helpers import sampling_metadata

V = 12
CPU = torch.device("cpu")


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def _edit(params, token_ids, num_prompt, logits):
    edits = LogitsEdits.build(params, TokenHistory(token_ids, num_prompt), V, CPU)
    return logits if edits is None else edits.apply(logits, sampling_metadata(params))


def test_nothing_asked_builds_nothing():
    history = TokenHistory([[1, 2], [3]], [1, 1])
    assert LogitsEdits.build([SamplingParams(), SamplingParams(temperature=0)], history, V, CPU) is None


def test_token_counts_scatter():
    counts = token_counts([[3, 3, 5], [], [11]], V, CPU)
    expected = torch.zeros(3, V)
    expected[0, 3], expected[0, 5], expected[2, 11] = 2, 1, 1
    assert torch.equal(counts, expected)


def test_repetition_penalty_matches_transformers_per_row():
    """Any penalty above 0 is allowed, as in vLLM and transformers (3.0 included)."""
    rows = [[1, 4, 4, 7, 2], [5, 6, 0], [9, 9], [2, 3, 3]]  # prompt + output
    num_prompt = [3, 1, 2, 1]
    params = [
        SamplingParams(repetition_penalty=1.7),
        SamplingParams(),
        SamplingParams(repetition_penalty=0.6),
        SamplingParams(repetition_penalty=3.0),
    ]
    logits = _logits(4)
    ours = _edit(params, rows, num_prompt, logits)
    for i, p in enumerate(params):
        ref = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(torch.tensor([rows[i]]), logits[i : i + 1].clone())
        torch.testing.assert_close(ours[i], ref[0], rtol=0, atol=0)
    assert not torch.equal(ours[0], logits[0])  # the penalty did something


def test_presence_and_frequency_hand_computed():
    prompt, output = [3, 8], [5, 5, 5, 8, 1]
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    logits = _logits(1)
    ours = _edit([p], [prompt + output], [len(prompt)], logits)
    expected = logits.clone()
    for token in set(output):
        expected[0, token] -= 0.5 + 0.25 * output.count(token)
    # prompt token 3 is untouched: OpenAI/vLLM presence and frequency look at the output only
    torch.testing.assert_close(ours, expected)


def test_logit_bias_matches_transformers_sequence_bias():
    p = SamplingParams(logit_bias={2: 5.0, 7: -100.0})
    logits = _logits(2)
    ours = _edit([SamplingParams(), p], [[1], [1]], [1, 1], logits)
    ref = SequenceBiasLogitsProcessor({(2,): 5.0, (7,): -100.0})(torch.tensor([[1]]), logits[1:].clone())
    torch.testing.assert_close(ours[1], ref[0])
    assert torch.equal(ours[0], logits[0])


def test_min_tokens_bans_stop_ids_until_reached_like_transformers():
    p = SamplingParams(min_tokens=3, stop_token_ids=[9])
    p._all_stop_token_ids = {2, 9}  # EOS 2 and the stop token, as the processor fills them in
    logits = _logits(3)
    prompt = [4, 4]
    rows = [prompt + [1, 1], prompt + [1, 1, 1], prompt]  # outputs of 2, 3 and 0 tokens
    ours = _edit([p, p, p], rows, [2, 2, 2], logits)
    for i in range(3):
        ref = MinNewTokensLengthLogitsProcessor(2, 3, [2, 9])(torch.tensor([rows[i]]), logits[i : i + 1].clone())
        assert torch.equal(ours[i], ref[0])
    assert torch.isinf(ours[0, [2, 9]]).all() and torch.isfinite(ours[1]).all()


def test_bad_words_single_and_multi_token():
    p = SamplingParams()
    p._bad_words_token_ids = [[6], [3, 4, 5]]
    logits = _logits(3)
    prompt = [3, 4]
    rows = [prompt + [7, 3, 4], prompt + [3, 7], prompt]  # row 0 ends with the prefix [3, 4]
    ours = _edit([p, p, p], rows, [2, 2, 2], logits)
    hf = NoBadWordsLogitsProcessor([[6], [3, 4, 5]], eos_token_id=11)
    for i, row in enumerate(rows[:2]):
        assert torch.equal(ours[i], hf(torch.tensor([row]), logits[i : i + 1].clone())[0])
    assert torch.isinf(ours[0, 5]) and torch.isfinite(ours[1, 5])
    # vLLM matches bad words against the output only: the prefix [3, 4] sitting in the prompt does not count
    assert torch.isinf(ours[2, 6]) and torch.isfinite(ours[2, 5])


def test_allowed_token_ids_mask_only_their_row():
    logits = _logits(2)
    ours = _edit([SamplingParams(allowed_token_ids=[1, 10]), SamplingParams()], [[0], [0]], [1, 1], logits)
    assert torch.isfinite(ours[0]).nonzero().flatten().tolist() == [1, 10]
    assert torch.equal(ours[1], logits[1])


def test_edits_leave_the_raw_logits_alone():
    logits = _logits(1)
    before = logits.clone()
    _edit([SamplingParams(repetition_penalty=1.5, logit_bias={1: 3.0})], [[1, 2]], [1], logits)
    assert torch.equal(logits, before)
