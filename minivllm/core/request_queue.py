"""Waiting queues of the scheduler, one per ``scheduler.policy``.

Both offer the subset of ``collections.deque`` the scheduler uses: ``append``
(a new request), ``appendleft`` (a preempted one, which must resume before
newer requests), ``popleft``/``[0]`` (the next to admit), ``remove``, ``len``
and iteration.

- fcfs: a plain deque; preempted requests go back to the front.
- priority: a heap ordered by ``(priority, arrival_time)``; lower values go
  first. A preempted request keeps its key, so it is readmitted before any
  request of the same priority that arrived after it.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Iterator

from minivllm.engine.request import Request


class PriorityRequestQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._tie = itertools.count()
        """Breaks ties between equal keys in insertion order (requests do not compare)."""

    def append(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_time, next(self._tie), request))

    appendleft = append  # the key, not the end pushed to, decides the order

    def popleft(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty queue")
        return heapq.heappop(self._heap)[-1]

    def __getitem__(self, index: int) -> Request:
        if index != 0:
            raise IndexError("a priority queue only exposes its head, [0]")
        if not self._heap:
            raise IndexError("queue is empty")
        return self._heap[0][-1]

    def remove(self, request: Request) -> None:
        for i, entry in enumerate(self._heap):
            if entry[-1] is request:
                self._heap[i] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                return
        raise ValueError(f"request {request.request_id} is not waiting")

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """In admission order."""
        return (entry[-1] for entry in sorted(self._heap, key=lambda e: e[:3]))

    def __contains__(self, request: object) -> bool:
        return any(entry[-1] is request for entry in self._heap)


def make_waiting_queue(policy: str) -> deque[Request] | PriorityRequestQueue:
    if policy == "priority":
        return PriorityRequestQueue()
    if policy == "fcfs":
        return deque()
    raise ValueError(f"scheduler.policy={policy!r}: must be one of fcfs, priority")
