"""How a cell's outputs are judged against its reference engine's.

Greedy requests must give the reference's tokens, text, finish and stop reasons, and
logprobs within ``LOGPROB_ATOL``. A seeded request must too: its noise depends only on
(seed, output position), whatever the batch, the preemptions or the ranks
(docs/sampling.md), and n-gram speculation verifies a drafted position with the noise
the plain sampler would draw for it (docs/spec_decode.md).
"""

from __future__ import annotations

from typing import Any

from tests.composition.cells import Cell
from tests.composition.workload import RequestSpec, check_completion

LOGPROB_ATOL = 1e-3
"""float32 logprobs of two cells differ by reduction order (tp's all-reduce, chunked
attention, batched drafts): ~1e-5 measured; 1e-3 leaves room and still catches a wrong
token's or a wrong position's logprob, which differ by whole nats on these models."""
FP8_LOGPROB_ATOL = 1e-2
"""With an fp8 cache, a key or value that differs in its last float32 bit can round to the
neighbouring e4m3 value (a 6-12% step): 1.5e-3 nat measured with one-token prefill chunks."""


def assert_same_as_reference(cell: Cell, specs: list[RequestSpec], outputs: list, reference: list) -> None:
    for spec, out, ref in zip(specs, outputs, reference, strict=True):
        assert len(out.outputs) == len(ref.outputs) == spec.levels["n"]
        for got, want in zip(out.outputs, ref.outputs):
            check_completion(spec, got)
            atol = FP8_LOGPROB_ATOL if cell["kv_cache_dtype"] == "fp8" else LOGPROB_ATOL
            _assert_same_completion(spec, got, want, atol)


def _assert_same_completion(spec: RequestSpec, got: Any, want: Any, atol: float) -> None:
    where = (spec.prompt[:24], spec.levels)
    assert list(got.token_ids) == list(want.token_ids), where
    assert (got.text, got.finish_reason, got.stop_reason) == (want.text, want.finish_reason, want.stop_reason), where
    if spec.levels["logprobs"] is None:
        assert got.logprobs is None or not got.logprobs, where
        return
    for pos, (lp_got, lp_want) in enumerate(zip(got.logprobs, want.logprobs, strict=True)):
        assert set(lp_got) == set(lp_want), (where, pos)
        for token, value in lp_want.items():
            assert abs(lp_got[token] - value) <= atol, (where, pos, token, lp_got[token], value)
