"""The scheduler's waiting queue: fair across client requests, for both ``scheduler.policy`` values.

It offers the subset of ``collections.deque`` the scheduler uses: ``append``
(a new request), ``appendleft`` (a preempted one, which must resume before
newer requests), ``popleft``/``[0]`` (the next to admit), ``remove``, ``len``,
``in`` and iteration (in admission order).

Fairness: a client request with ``n > 1``, or a server request with several
prompts, arrives as sequences of one *lane* (``Request.group_id``); a single
sequence is a lane of its own. Lanes
take turns, so one huge ``n`` cannot hold back a small request that arrives
after it: each sequence gets a *turn* when queued, one past its lane's previous
one and never below the turn being served now::

    lane A (n=4) arrives:   A0@0  A1@1  A2@2  A3@3
    A0 admitted (turn 0);   B (n=1) arrives: B0@max(0, 0)=0  -> B0 goes before A1
    A1 admitted (turn 1);   C arrives:       C0@1            -> C0 goes before A2

The order is ``(priority, turn, arrival_time)``; under ``fcfs`` every priority is
0, so with ``n = 1`` traffic it is plain first-come-first-served. A preempted
request goes back in at the current turn: under ``fcfs`` ahead of everything
(it resumes before newer work, as vLLM does), under ``priority`` ahead of the
requests of its priority that arrived after it.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Iterator

from minivllm.request import Request

_Entry = tuple[int, int, int, float, int, Request]
"""(priority, 0 for a resumed fcfs request else 1, turn, arrival_time, tie, request)."""


class FairRequestQueue:
    def __init__(self, by_priority: bool) -> None:
        self.by_priority = by_priority
        self._heap: list[_Entry] = []
        self._tie = itertools.count()
        """Breaks ties between equal keys in insertion order (requests do not compare)."""
        self._turn = 0
        """The turn being served: the highest turn admitted so far."""
        self._lane_next: dict[str, int] = {}
        """Per lane with sequences waiting: the turn its next new sequence gets."""
        self._lane_size: dict[str, int] = {}

    # ---- in ---------------------------------------------------------------------------
    def append(self, request: Request) -> None:
        lane = _lane(request)
        turn = max(self._turn, self._lane_next.get(lane, 0))
        self._lane_next[lane] = turn + 1
        self._push(request, resumed=False, turn=turn)

    def appendleft(self, request: Request) -> None:
        """A preempted request: it resumes before newer work."""
        self._push(request, resumed=not self.by_priority, turn=self._turn)

    def _push(self, request: Request, *, resumed: bool, turn: int) -> None:
        priority = request.priority if self.by_priority else 0
        entry = (priority, 0 if resumed else 1, turn, request.arrival_time, next(self._tie), request)
        heapq.heappush(self._heap, entry)
        lane = _lane(request)
        self._lane_size[lane] = self._lane_size.get(lane, 0) + 1

    # ---- out --------------------------------------------------------------------------
    def popleft(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty queue")
        entry = heapq.heappop(self._heap)
        self._turn = max(self._turn, entry[2])
        self._left(entry[-1])
        return entry[-1]

    def remove(self, request: Request) -> None:
        for i, entry in enumerate(self._heap):
            if entry[-1] is request:
                self._heap[i] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                self._left(request)
                return
        raise ValueError(f"request {request.request_id} is not waiting")

    def _left(self, request: Request) -> None:
        lane = _lane(request)
        self._lane_size[lane] -= 1
        if not self._lane_size[lane]:
            del self._lane_size[lane]
            self._lane_next.pop(lane, None)

    # ---- looking --------------------------------------------------------------------------
    def __getitem__(self, index: int) -> Request:
        if index != 0:
            raise IndexError("the waiting queue only exposes its head, [0]")
        if not self._heap:
            raise IndexError("queue is empty")
        return self._heap[0][-1]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """In admission order."""
        return (entry[-1] for entry in sorted(self._heap, key=lambda e: e[:5]))

    def __contains__(self, request: object) -> bool:
        return any(entry[-1] is request for entry in self._heap)


def _lane(request: Request) -> str:
    return request.group_id or request.request_id


def make_waiting_queue(policy: str) -> FairRequestQueue:
    if policy not in ("fcfs", "priority"):
        raise ValueError(f"scheduler.policy={policy!r}: must be one of fcfs, priority")
    return FairRequestQueue(by_priority=policy == "priority")
