"""The waiting queue's order: first-come-first-served for single requests, turns
between client requests when one of them has many sequences (n > 1), preempted
requests first, and priorities before turns."""

from __future__ import annotations

from minivllm.core.request_queue import make_waiting_queue
from minivllm.request import Request, RequestId
from minivllm.sampling_params import SamplingParams

_clock = iter(range(1_000_000))


def seq(name: str, parent: str | None = None, priority: int = 0) -> Request:
    params = SamplingParams(max_tokens=4)
    return Request(
        RequestId(name), [1, 2], params, None, 4, arrival_time=float(next(_clock)), priority=priority, group_id=parent
    )


def drain(queue) -> list[str]:
    out = []
    while queue:
        assert queue[0] is next(iter(queue))
        out.append(queue.popleft().request_id)
    return out


def test_single_requests_are_first_come_first_served():
    queue = make_waiting_queue("fcfs")
    for name in "abcde":
        queue.append(seq(name))
    assert [r.request_id for r in queue] == list("abcde")
    assert drain(queue) == list("abcde")


def test_a_huge_n_request_takes_turns_with_later_ones():
    queue = make_waiting_queue("fcfs")
    for i in range(6):
        queue.append(seq(f"A{i}", parent="A"))
    assert queue.popleft().request_id == "A0"
    queue.append(seq("B0", parent="B"))  # arrives after A0 was admitted
    assert queue.popleft().request_id == "B0"
    assert queue.popleft().request_id == "A1"
    queue.append(seq("C0"))
    queue.append(seq("D0", parent="D"))
    queue.append(seq("D1", parent="D"))
    # C0 and D0 get the turn now served (1), before A2 (turn 2); D1 shares turn 2 with A2
    assert drain(queue) == ["C0", "D0", "A2", "D1", "A3", "A4", "A5"]


def test_two_huge_requests_alternate():
    queue = make_waiting_queue("fcfs")
    for i in range(3):
        queue.append(seq(f"A{i}", parent="A"))
    for i in range(3):
        queue.append(seq(f"B{i}", parent="B"))
    assert drain(queue) == ["A0", "B0", "A1", "B1", "A2", "B2"]


def test_a_preempted_request_resumes_first_under_fcfs():
    queue = make_waiting_queue("fcfs")
    for name in "ab":
        queue.append(seq(name))
    first = queue.popleft()
    queue.appendleft(first)
    queue.append(seq("c"))
    assert drain(queue) == ["a", "b", "c"]
    late = seq("late")
    queue.append(seq("x"))
    queue.appendleft(late)
    assert drain(queue) == ["late", "x"]


def test_priority_goes_before_turns_and_turns_within_a_priority():
    queue = make_waiting_queue("priority")
    for i in range(3):
        queue.append(seq(f"A{i}", parent="A", priority=1))
    queue.append(seq("low", priority=2))
    queue.append(seq("B0", parent="B", priority=1))
    queue.append(seq("urgent", priority=0))
    assert drain(queue) == ["urgent", "A0", "B0", "A1", "A2", "low"]


def test_remove_and_membership():
    queue = make_waiting_queue("fcfs")
    a, b = seq("a", parent="P"), seq("b", parent="P")
    queue.append(a)
    queue.append(b)
    queue.remove(a)
    assert a not in queue and b in queue and len(queue) == 1
    assert drain(queue) == ["b"]
