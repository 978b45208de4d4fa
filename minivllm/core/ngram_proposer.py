"""Prompt-lookup (n-gram) proposals: copy what followed the sequence's tail the last time it occurred.

For a sequence ``... a b c x y z ... a b c`` whose last ``n`` tokens (``a b c``)
occur earlier, the tokens after that earlier occurrence (``x y z``) are the
drafts. The longest ``n`` in ``[prompt_lookup_min, prompt_lookup_max]`` with a
match wins, and of its matches the most recent one that is followed by all ``k``
drafts (else the earliest, which has the most followers). It needs only token ids,
so it runs in the scheduler before each step, with no model and no device.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from minivllm.request import Request


class NgramProposer:
    def __init__(self, min_n: int, max_n: int, max_num_drafts: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.max_num_drafts = max_num_drafts

    def propose(self, token_ids: list[int] | np.ndarray, max_num_drafts: int | None = None) -> list[int]:
        """Up to ``max_num_drafts`` (default the configured number) draft tokens; [] without a match."""
        k = self.max_num_drafts if max_num_drafts is None else min(max_num_drafts, self.max_num_drafts)
        tokens = np.asarray(token_ids, dtype=np.int64)
        if k <= 0 or len(tokens) <= self.min_n:
            return []
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            start = _best_match(tokens, n, k)
            if start is not None:
                return tokens[start + n : start + n + k].tolist()
        return []

    def drafts(self, request: Request, max_num_drafts: int) -> list[int]:
        """The ``DraftSource`` view: drafts from the request's own known tokens."""
        return self.propose(request.all_token_ids, max_num_drafts)


def _best_match(tokens: np.ndarray, n: int, k: int) -> int | None:
    """Start of an earlier occurrence of the last ``n`` tokens: the latest one with ``k``
    tokens after it, else the earliest; None when there is none."""
    windows = sliding_window_view(tokens[:-1], n)  # (L - n, n): every window with a follower
    hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
    if not len(hits):
        return None
    full = hits[hits + n + k <= len(tokens)]
    return int(full[-1]) if len(full) else int(hits[0])
