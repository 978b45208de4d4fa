"""The sampler's distributions: masks never leak, frequencies follow the softmax, and a
seeded row draws the same token whatever else is in the batch. Fixed seeds throughout,
so every statistical check is deterministic."""

from __future__ import annotations

import pytest
import torch

from minivllm.sample.logits_processors import LogitsEdits, TokenHistory
from minivllm.sample.sampler import Sampler, greedy_tokens
from minivllm.sampling_params import SamplingParams
from tests.sample.helpers import sampling_metadata

V = 24
CPU = torch.device("cpu")
LOGITS = torch.randn(V, generator=torch.Generator().manual_seed(1)) * 1.5


def _draw(params: SamplingParams, num: int, seed: int = 0) -> torch.Tensor:
    """``num`` independent draws from LOGITS under ``params`` (one batch of identical rows)."""
    meta = sampling_metadata([params] * num)
    sampler = Sampler(torch.Generator().manual_seed(seed))
    return sampler(LOGITS.expand(num, V).clone(), meta).token_ids


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square test of ``counts`` against ``probs`` (cells with p > 0)."""
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    stat = ((counts[keep].double() - expected) ** 2 / expected).sum()
    df = keep.sum().item() - 1
    return torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2).item()


def _kept_probs(kept: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Softmax of LOGITS / temperature renormalised over the ``kept`` (bool) tokens."""
    probs = (LOGITS / temperature).softmax(-1) * kept
    return probs / probs.sum()


def _top_p_set(p: float) -> torch.Tensor:
    probs = LOGITS.softmax(-1)
    order = probs.argsort(descending=True)
    before = probs[order].cumsum(0) - probs[order]  # mass of strictly more likely tokens
    kept = torch.zeros(V, dtype=torch.bool)
    kept[order[before < p]] = True
    return kept


def _top_k_set(k: int) -> torch.Tensor:
    return torch.zeros(V, dtype=torch.bool).index_fill(0, LOGITS.topk(k).indices, True)


def _min_p_set(min_p: float) -> torch.Tensor:
    probs = LOGITS.softmax(-1)
    return probs >= min_p * probs.max()


CASES = {
    "top_k": (SamplingParams(temperature=1.0, top_k=5), lambda: _top_k_set(5)),
    "top_p": (SamplingParams(temperature=1.0, top_p=0.6), lambda: _top_p_set(0.6)),
    "min_p": (SamplingParams(temperature=1.0, min_p=0.2), lambda: _min_p_set(0.2)),
}


@pytest.mark.parametrize("name", CASES)
def test_masks_never_leak_and_kept_tokens_follow_the_renormalised_softmax(name):
    params, kept_fn = CASES[name]
    kept = kept_fn()
    assert 1 < kept.sum() < V  # the mask matters
    tokens = _draw(params, 20_000)
    counts = torch.bincount(tokens, minlength=V)
    assert counts[~kept].sum() == 0, f"{name} emitted tokens outside the allowed set"
    assert _chi_square_p(counts, _kept_probs(kept)) > 1e-3


def test_temperature_frequencies_match_the_softmax():
    tokens = _draw(SamplingParams(temperature=0.7), 30_000, seed=3)
    counts = torch.bincount(tokens, minlength=V)
    everything = torch.ones(V, dtype=torch.bool)
    assert _chi_square_p(counts, _kept_probs(everything, 0.7)) > 1e-3
    # the test can tell temperatures apart: the same counts reject the T=1 softmax
    assert _chi_square_p(counts, _kept_probs(everything, 1.0)) < 1e-6


def test_greedy_rows_take_the_argmax_in_a_mixed_batch():
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0), SamplingParams(temperature=0)]
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(5))
    out = Sampler(torch.Generator().manual_seed(0))(logits, sampling_metadata(params))
    assert out.token_ids[[0, 2]].tolist() == logits[[0, 2]].argmax(-1).tolist()


def test_penalties_change_greedy_choice():
    logits = torch.zeros(1, V)
    logits[0, 4], logits[0, 9] = 2.0, 1.5
    params = [SamplingParams(temperature=0, frequency_penalty=1.0)]
    meta = sampling_metadata(params)
    meta.edits = LogitsEdits.build(params, TokenHistory([[0, 4, 4]], [1]), V, CPU)
    assert Sampler()(logits, meta).token_ids.item() == 9  # token 4 appears twice in the output: 2.0 - 2 < 1.5


def _seeded_token(seed: int, others: list[SamplingParams], position: int) -> int:
    """Sample a seeded row placed at ``position`` among ``others``, each with its own logits."""
    params = list(others)
    params.insert(position, SamplingParams(temperature=0.9, top_p=0.9, seed=seed))
    gens = {position: torch.Generator().manual_seed(seed)}
    for row, p in enumerate(params):
        if p.seed is not None and row != position:
            gens[row] = torch.Generator().manual_seed(p.seed)
    logits = torch.randn(len(params), V, generator=torch.Generator().manual_seed(100 + len(others)))
    logits[position] = LOGITS
    meta = sampling_metadata(params)
    meta.generators = gens
    return Sampler(torch.Generator().manual_seed(len(others)))(logits, meta).token_ids[position].item()


def test_seeded_row_ignores_batch_composition_and_position():
    batches = [
        ([], 0),
        ([SamplingParams(temperature=1.0)] * 3, 2),
        ([SamplingParams(temperature=0), SamplingParams(temperature=1.2, top_k=3, seed=9)], 1),
        ([SamplingParams(temperature=0.5, min_p=0.1)] * 6, 0),
    ]
    seeds = range(40)
    reference = [_seeded_token(s, [], 0) for s in seeds]
    assert len(set(reference)) > 3  # the seeds matter
    for others, position in batches:
        assert [_seeded_token(s, others, position) for s in seeds] == reference


def test_greedy_tokens_on_the_cpu_pick_torch_argmax_index_with_ties_nan_and_inf():
    """The CPU fast path (numpy) against torch's own argmax, on rows where the first
    largest entry matters: ties, NaN (counts as largest), +-inf, all -inf."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 4, (64, 50), generator=g).float()  # many ties
    logits[torch.rand(64, 50, generator=g) < 0.05] = float("nan")
    logits[torch.rand(64, 50, generator=g) < 0.1] = float("-inf")
    logits[torch.rand(64, 50, generator=g) < 0.02] = float("inf")
    logits[3] = float("-inf")
    got = greedy_tokens(logits)
    assert got.dtype == torch.int64
    assert torch.equal(got, logits.argmax(dim=-1))
    view = logits[:, ::2]  # not contiguous
    assert torch.equal(greedy_tokens(view), view.argmax(dim=-1))
