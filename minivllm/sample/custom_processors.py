"""Per-request logits processors: user callables ``(output_token_ids, logits) -> logits``.

vLLM's older per-request contract: each callable sees one row's (vocab,) logits
and the tokens generated so far, and returns the new logits. They cannot be
batched, so they run row by row, and only for the rows of requests that set
``SamplingParams.logits_processors``; every other row (and every step of a
batch without them) takes the batched path untouched.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Callable

import torch

from minivllm.sample.history import TokenHistory
from minivllm.sampling_params import SamplingParams


@dataclass
class CustomProcessors:
    rows: list[tuple[int, list[Callable[..., Any]], list[int]]]
    """(row, the request's callables, its output token ids so far)."""

    @classmethod
    def build(cls, params: list[SamplingParams], history: TokenHistory) -> "CustomProcessors | None":
        rows = [(row, p.logits_processors, history.output(row)) for row, p in enumerate(params) if p.logits_processors]
        return cls(rows) if rows else None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """(N, V) logits, edited in place row by row; a callable that returns the wrong shape is an error."""
        for row, processors, output_ids in self.rows:
            values = logits[row]  # (V,)
            for proc in processors:
                values = proc(output_ids, values)
                if not isinstance(values, torch.Tensor) or values.shape != logits[row].shape:
                    raise ValueError(
                        f"logits_processors: {getattr(proc, '__name__', proc)!r} must return a tensor of shape "
                        f"{tuple(logits[row].shape)}"
                    )
            logits[row] = values
        return logits


def check_picklable(params: SamplingParams) -> None:
    """Callables that must reach another process (tp > 1 workers, AsyncLLM's engine process) must
    pickle: a lambda or a local function cannot; a module-level function or class instance can."""
    if not params.logits_processors:
        return
    try:
        pickle.dumps(params.logits_processors)
    except Exception as err:  # noqa: BLE001 - pickle raises several types
        raise ValueError(
            f"logits_processors: must be picklable to run in another process (define them at module level): {err}"
        ) from None
