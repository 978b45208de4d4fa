"""Rejection sampling keeps the target distribution: a chi-square test on many
draws of a small vocabulary (temperature, top-k and top-p applied by the plain
sampler's processing), greedy acceptance, and the emitted-token rule."""

from __future__ import annotations

import pytest
import torch

from minivllm.sample.rejection_sampler import VerifyInputs, emitted_tokens, rejection_sample
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams
from tests.sample.helpers import sampling_metadata

V = 8
DRAWS = 40_000
CHI2_CRIT_DF7_P0001 = 24.32  # chi-square critical value, 7 degrees of freedom, p = 0.001


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token of probability zero was emitted"
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def _processed(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target distribution as the plain sampler draws from it."""
    meta = sampling_metadata([params])
    return Sampler().process(logits.unsqueeze(0), meta).softmax(dim=-1)[0]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.8),
    ],
)
@pytest.mark.parametrize("rank", [0, 1, V - 1])
def test_first_and_second_tokens_follow_the_target_distribution(params, rank):
    """The draft is the target's ``rank``-th likeliest token (the last may have probability zero)."""
    gen = torch.Generator().manual_seed(1234 + rank)
    logits = torch.randn(2, V, generator=gen) * 1.5  # positions 0 and 1 of one request
    p = torch.stack([_processed(logits[0], params), _processed(logits[1], params)])
    draft = int(p[0].argsort(descending=True)[rank])
    # every draw is one request with one draft token and the bonus row after it
    rows_logits = logits.repeat(DRAWS, 1)  # the bonus row's logits do not matter here
    probs = p.repeat(DRAWS, 1)
    drafts = torch.tensor([draft, -1], dtype=torch.int64).repeat(DRAWS)
    inputs = VerifyInputs(
        draft_token_ids=drafts,
        greedy=torch.zeros(2 * DRAWS, dtype=torch.bool),
        uniform=torch.rand(2 * DRAWS, generator=gen),
        exponential=torch.empty(2 * DRAWS, V).exponential_(generator=gen),
    )
    own, accepted = rejection_sample(rows_logits, probs, inputs)
    own, accepted = own.view(DRAWS, 2), accepted.view(DRAWS, 2)
    first = torch.where(accepted[:, 0], drafts.view(DRAWS, 2)[:, 0], own[:, 0])
    assert _chi_square(torch.bincount(first, minlength=V).float(), p[0]) < CHI2_CRIT_DF7_P0001
    if p[0, draft] < 0.05:
        return  # too few acceptances to test the bonus row
    second = own[accepted[:, 0], 1]  # after an accepted draft, the bonus row's own token
    assert _chi_square(torch.bincount(second, minlength=V).float(), p[1]) < CHI2_CRIT_DF7_P0001


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=5)])
@pytest.mark.parametrize("sharpness", [0.5, 3.0])
def test_a_sampling_draft_model_keeps_the_target_distribution(params, sharpness):
    """Drafts drawn from a non-degenerate q (a draft model's distribution, with a zero entry)
    are accepted with min(1, p/q) and resampled from max(p - q, 0): the output follows p, and
    the acceptance rate is the optimal sum(min(p, q)) (treating d as one-hot would keep p too,
    but accept only sum(p * q))."""
    gen = torch.Generator().manual_seed(99 + int(sharpness))
    logits = torch.randn(2, V, generator=gen) * 1.5
    p = torch.stack([_processed(logits[0], params), _processed(logits[1], params)])
    q = (torch.randn(V, generator=gen) * sharpness).softmax(dim=-1)
    q[3] = 0.0  # a token the draft never proposes
    q /= q.sum()
    drafts = torch.multinomial(q, DRAWS, replacement=True, generator=gen)  # (DRAWS,)
    draft_ids = torch.stack([drafts, torch.full_like(drafts, -1)], dim=1).view(-1)
    draft_probs = torch.stack([q, torch.zeros(V)]).repeat(DRAWS, 1)  # bonus rows have no q
    inputs = VerifyInputs(
        draft_token_ids=draft_ids,
        greedy=torch.zeros(2 * DRAWS, dtype=torch.bool),
        uniform=torch.rand(2 * DRAWS, generator=gen),
        exponential=torch.empty(2 * DRAWS, V).exponential_(generator=gen),
        draft_probs=draft_probs,
    )
    own, accepted = rejection_sample(logits.repeat(DRAWS, 1), p.repeat(DRAWS, 1), inputs)
    own, accepted = own.view(DRAWS, 2), accepted.view(DRAWS, 2)
    first = torch.where(accepted[:, 0], drafts, own[:, 0])
    assert _chi_square(torch.bincount(first, minlength=V).float(), p[0]) < CHI2_CRIT_DF7_P0001
    second = own[accepted[:, 0], 1]
    assert _chi_square(torch.bincount(second, minlength=V).float(), p[1]) < CHI2_CRIT_DF7_P0001
    rate, optimal, one_hot = accepted[:, 0].float().mean(), torch.minimum(p[0], q).sum(), (p[0] * q).sum()
    assert abs(rate - optimal) < 4 * (optimal * (1 - optimal) / DRAWS) ** 0.5
    assert optimal - one_hot > 0.05


def test_the_same_noise_gives_the_same_tokens():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, V, generator=gen)
    probs = logits.softmax(dim=-1)
    make = lambda: VerifyInputs(  # noqa: E731
        torch.tensor([1, 2, 3, -1]),
        torch.zeros(4, dtype=torch.bool),
        torch.rand(4, generator=torch.Generator().manual_seed(5)),
        torch.empty(4, V).exponential_(generator=torch.Generator().manual_seed(6)),
    )
    first, second = rejection_sample(logits, probs, make()), rejection_sample(logits, probs, make())
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_greedy_accepts_exactly_the_argmax():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    inputs = VerifyInputs(
        torch.tensor([1, 2, -1]),
        torch.ones(3, dtype=torch.bool),
        torch.zeros(3),
        torch.ones(3, 3),
    )
    own, accepted = rejection_sample(logits, logits.softmax(dim=-1), inputs)
    assert own.tolist() == [1, 0, 2]
    assert accepted.tolist() == [True, False, False]
    assert emitted_tokens([1, 2], own.tolist(), accepted.tolist()) == [1, 0]


def test_emitted_tokens():
    assert emitted_tokens([4, 5, 6], [9, 9, 9, 7], [True, True, True, False]) == [4, 5, 6, 7]
    assert emitted_tokens([4, 5, 6], [8, 9, 9, 7], [False, True, True, False]) == [8]
    assert emitted_tokens([4, 5, 6], [8, 3, 9, 7], [True, False, True, False]) == [4, 3]
