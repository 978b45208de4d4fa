"""The runner-side pooler: a finished prompt's hidden states -> one vector.

``Pooler`` replaces sampling when ``model.runner=pooling``. Each step it sees
the flat batch's hidden states (after the model's final norm) and, for every
request whose prompt is now fully computed, returns the pooled vector:

- ``LAST``: the hidden state of the prompt's last token (always computed in this
  step, so prefix-cached blocks are fine);
- ``MEAN``: the mean over all prompt tokens. Prefill chunks arrive over several
  steps, so a running fp32 sum is kept per request; it restarts whenever a
  request's chunk starts at position 0 (first step, or recompute after a
  preemption). Cached prefixes are never computed, so MEAN runs with prefix
  caching off (see ``VllmConfig``).

The request also gets one placeholder token so the scheduler finishes it
(pooling requests ask for ``max_tokens=1``).
"""

from __future__ import annotations

import torch

from minivllm.config.model import POOLING_TYPES
from minivllm.outputs import ModelRunnerOutput
from minivllm.request import RequestId

PLACEHOLDER_TOKEN = 0


class Pooler:
    def __init__(self, pooling_type: str) -> None:
        if pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type={pooling_type!r}: must be one of {', '.join(POOLING_TYPES)}")
        self.pooling_type = pooling_type
        self._sums: dict[RequestId, torch.Tensor] = {}
        """MEAN only: request -> (H,) fp32 sum of the hidden states computed so far."""

    def __call__(
        self,
        hidden: torch.Tensor,
        req_ids: list[RequestId],
        computed: list[int],
        query_lens: list[int],
        done_rows: list[int],
        forget: set[RequestId],
    ) -> ModelRunnerOutput:
        """hidden: (T, H), request i's rows are ``query_lens[i]`` consecutive ones; ``computed[i]``:
        its tokens computed before this step; ``done_rows``: the requests whose prompt is now complete;
        ``forget``: requests finished or preempted since the last step."""
        for req_id in forget:
            self._sums.pop(req_id, None)
        starts = [0]
        for n in query_lens[:-1]:
            starts.append(starts[-1] + n)
        if self.pooling_type == "MEAN":
            self._accumulate(hidden, req_ids, computed, query_lens, starts)
        out = ModelRunnerOutput()
        for i in done_rows:
            req_id = req_ids[i]
            if self.pooling_type == "LAST":
                pooled = hidden[starts[i] + query_lens[i] - 1].float()  # (H,)
            else:
                pooled = self._sums.pop(req_id) / (computed[i] + query_lens[i])
            out.sampled_token_ids[req_id] = [PLACEHOLDER_TOKEN]
            out.pooler_output[req_id] = pooled.cpu()
        return out

    def _accumulate(
        self,
        hidden: torch.Tensor,
        req_ids: list[RequestId],
        computed: list[int],
        query_lens: list[int],
        starts: list[int],
    ) -> None:
        for i, req_id in enumerate(req_ids):
            chunk_sum = hidden[starts[i] : starts[i] + query_lens[i]].float().sum(dim=0)  # (H,)
            if computed[i] == 0:
                self._sums[req_id] = chunk_sum
            elif req_id in self._sums:
                self._sums[req_id] += chunk_sum
            else:
                raise RuntimeError(f"request {req_id}: MEAN pooling lost its earlier chunks (prefix caching on?)")
