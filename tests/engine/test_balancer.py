"""LoadBalancer: fewest unfinished requests first; a remembered prefix goes back to its replica."""

from __future__ import annotations

from minivllm.engine.balancer import LoadBalancer

BS = 4


def prompt(prefix: int, blocks: int, tail: int) -> list[int]:
    """``blocks`` whole blocks shared by every prompt with the same ``prefix``, then a distinct tail."""
    return [prefix * 100 + i for i in range(blocks * BS)] + [7000 + tail, 7001 + tail]


def test_fewest_unfinished_first_ties_to_the_lowest_replica():
    lb = LoadBalancer(3, BS, prefix_affinity=False)
    assert [lb.pick([1, 2, 3]) for _ in range(4)] == [0, 1, 2, 0]
    lb.finished(1)
    lb.finished(2)
    assert lb.load == [2, 0, 0]
    assert lb.pick([1]) == 1 and lb.pick([1]) == 2
    assert lb.routed == [2, 2, 2]


def test_without_affinity_a_shared_prefix_is_spread():
    lb = LoadBalancer(2, BS, prefix_affinity=False)
    assert [lb.pick(prompt(1, 3, t)) for t in range(4)] == [0, 1, 0, 1]


def test_a_shared_prefix_goes_back_to_its_replica():
    lb = LoadBalancer(2, BS, prefix_affinity=True, affinity_slack=2)
    first = lb.pick(prompt(1, 3, 0))
    other = lb.pick(prompt(2, 3, 0))  # a different prefix: the idle replica
    assert (first, other) == (0, 1)
    assert lb.pick(prompt(1, 3, 1)) == 0  # same 3 blocks: replica 0 although both hold one request
    assert lb.pick(prompt(2, 1, 5)) == 1  # shares only the first block with prefix 2: still a match
    assert lb.load == [2, 2]


def test_affinity_yields_to_load_beyond_the_slack():
    lb = LoadBalancer(2, BS, prefix_affinity=True, affinity_slack=1)
    picks = [lb.pick(prompt(1, 2, t)) for t in range(4)]
    assert picks == [0, 0, 1, 1]  # the third would put replica 0 two ahead: least loaded instead
    assert lb.load == [2, 2]


def test_the_longest_remembered_prefix_wins():
    lb = LoadBalancer(2, BS, prefix_affinity=True, affinity_slack=8)
    lb.pick(prompt(1, 1, 0))  # remembers block 0 of prefix 1 -> replica 0
    lb.finished(0)
    lb.load = [0, 5]
    long_prefix = prompt(1, 3, 0)
    lb._remember(lb._prefix_keys(long_prefix), 1)  # blocks 0..2 last went to replica 1
    assert lb.pick(prompt(1, 3, 4)) == 1


def test_a_partial_last_block_and_the_last_token_never_count():
    lb = LoadBalancer(2, BS, prefix_affinity=True)
    assert len(lb._prefix_keys(list(range(BS)))) == 0  # one block, but its last token is always computed
    assert len(lb._prefix_keys(list(range(BS + 1)))) == 1
    assert len(lb._prefix_keys(list(range(2 * BS + 3)))) == 2


def test_remembered_prefixes_are_bounded():
    lb = LoadBalancer(2, BS, prefix_affinity=True, max_remembered=3)
    for p in range(5):
        lb.pick(prompt(p, 2, 0))
    assert len(lb._prefixes) == 3
