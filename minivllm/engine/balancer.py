"""Which data-parallel replica gets a request: the least loaded, or the one that
already holds the request's prefix in its cache.

Load is what the front end knows without asking: requests sent to a replica
and not yet finished (its waiting + running). With prefix caching on, the
balancer also remembers, for each prefix of whole KV blocks it has routed, the
replica it went to; a new request whose prompt starts with a remembered prefix
goes back there (its blocks are likely cached) unless that replica is busier
than the least loaded one by more than ``affinity_slack`` requests::

    prompt blocks:   [b0][b1][b2][b3 partial]
    prefix keys:     h(b0), h(b0 b1), h(b0 b1 b2)     longest remembered key wins
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

ReplicaId = int


class LoadBalancer:
    def __init__(
        self,
        num_replicas: int,
        block_size: int,
        prefix_affinity: bool,
        affinity_slack: int = 4,
        max_remembered: int = 1 << 16,
    ) -> None:
        if num_replicas < 1:
            raise ValueError(f"parallel.dp={num_replicas}: must be at least 1")
        self.block_size = block_size
        self.prefix_affinity = prefix_affinity
        self.affinity_slack = affinity_slack
        """How many more unfinished requests than the least loaded replica a prefix's replica may have."""
        self.max_remembered = max_remembered
        self.load: list[int] = [0] * num_replicas
        """Unfinished requests per replica."""
        self.routed: list[int] = [0] * num_replicas
        """Requests ever sent to each replica."""
        self._prefixes: OrderedDict[int, ReplicaId] = OrderedDict()
        """Hash of a whole-block prompt prefix -> the replica it last went to (least recently used first)."""

    def pick(self, prompt_token_ids: Sequence[int]) -> ReplicaId:
        """The replica for a new request (counted as started there)."""
        least = min(range(len(self.load)), key=lambda r: (self.load[r], r))
        keys = self._prefix_keys(prompt_token_ids) if self.prefix_affinity else []
        replica = least
        for key in reversed(keys):  # longest prefix first
            cached = self._prefixes.get(key)
            if cached is not None and self.load[cached] - self.load[least] <= self.affinity_slack:
                replica = cached
                break
        self._remember(keys, replica)
        self.load[replica] += 1
        self.routed[replica] += 1
        return replica

    def finished(self, replica: ReplicaId) -> None:
        """A request on ``replica`` finished or was aborted."""
        self.load[replica] = max(0, self.load[replica] - 1)

    def _prefix_keys(self, ids: Sequence[int]) -> list[int]:
        """One key per whole-block prefix of the prompt, each chained from the one
        before (the last token never counts: the engine always computes it)."""
        keys, key = [], 0
        for start in range(0, (len(ids) - 1) // self.block_size * self.block_size, self.block_size):
            key = hash((key, tuple(ids[start : start + self.block_size])))
            keys.append(key)
        return keys

    def _remember(self, keys: list[int], replica: ReplicaId) -> None:
        for key in keys:
            self._prefixes[key] = replica
            self._prefixes.move_to_end(key)
        while len(self._prefixes) > self.max_remembered:
            self._prefixes.popitem(last=False)
