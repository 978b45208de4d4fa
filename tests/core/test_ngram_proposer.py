"""Prompt lookup: the longest suffix match wins, then the most recent occurrence."""

from __future__ import annotations

import pytest

from minivllm.core.spec_decode import NgramProposer


def test_longest_suffix_match_and_its_followers():
    proposer = NgramProposer(min_n=2, max_n=3, max_num_drafts=3)
    # the suffix "1 2 3" occurred at the start; "7 8 9" followed it
    assert proposer.propose([1, 2, 3, 7, 8, 9, 4, 1, 2, 3]) == [7, 8, 9]


def test_most_recent_occurrence_wins():
    proposer = NgramProposer(min_n=2, max_n=3, max_num_drafts=3)
    assert proposer.propose([1, 2, 3, 7, 1, 2, 3, 5, 1, 2, 3]) == [5, 1, 2]


def test_a_longer_match_beats_a_more_recent_shorter_one():
    proposer = NgramProposer(min_n=1, max_n=3, max_num_drafts=2)
    # "4 5 6" occurs once (followed by 8); the 1-gram "6" occurs later (followed by 9)
    assert proposer.propose([4, 5, 6, 8, 6, 9, 4, 5, 6]) == [8, 6]


def test_drafts_stop_at_the_end_of_the_sequence_and_at_the_limit():
    proposer = NgramProposer(min_n=2, max_n=2, max_num_drafts=5)
    assert proposer.propose([1, 2, 3, 1, 2]) == [3, 1, 2]
    assert proposer.propose([1, 2, 3, 1, 2], max_num_drafts=1) == [3]


def test_no_match_no_drafts():
    proposer = NgramProposer(min_n=2, max_n=4, max_num_drafts=3)
    assert proposer.propose([1, 2, 3, 4, 5]) == []
    assert proposer.propose([5, 5]) == []
    assert proposer.propose([1, 2, 1, 2], max_num_drafts=0) == []


def test_a_match_with_all_k_followers_beats_a_later_one_with_fewer():
    proposer = NgramProposer(min_n=2, max_n=2, max_num_drafts=3)
    # "5 6" at 0 (followed by 7 8 9), at 5 (followed by 5 6 only), and as the suffix
    assert proposer.propose([5, 6, 7, 8, 9, 5, 6, 5, 6]) == [7, 8, 9]


def test_lookup_bounds_follow_vllm_defaults_and_belong_to_ngram_only():
    from minivllm.config.speculative import SpeculativeConfig

    both = SpeculativeConfig(method="ngram")
    assert (both.prompt_lookup_min, both.prompt_lookup_max) == (5, 5)
    only_max = SpeculativeConfig(method="ngram", prompt_lookup_max=3)
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (3, 3)
    only_min = SpeculativeConfig(method="ngram", prompt_lookup_min=2)
    assert (only_min.prompt_lookup_min, only_min.prompt_lookup_max) == (2, 2)
    with pytest.raises(ValueError, match="prompt_lookup_min=4 exceeds speculative.prompt_lookup_max=3"):
        SpeculativeConfig(method="ngram", prompt_lookup_min=4, prompt_lookup_max=3)
    with pytest.raises(ValueError, match="speculative.prompt_lookup_max: only used by speculative.method=ngram"):
        SpeculativeConfig(method="draft_model", model="draft", prompt_lookup_max=3)
