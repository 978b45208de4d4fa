"""The runner-side Pooler on hand-made batches: chunked prompts, two requests in one batch,
and a preemption that restarts a request's prompt; the oracle is torch's mean / indexing."""

from __future__ import annotations

import pytest
import torch

from minivllm.pooling.pooler import PLACEHOLDER_TOKEN, Pooler
from minivllm.request import RequestId

A, B = RequestId("a"), RequestId("b")


def test_mean_over_chunks_restarts_after_a_preemption():
    gen = torch.Generator().manual_seed(0)
    prompt_a, prompt_b = torch.randn(10, 4, generator=gen), torch.randn(3, 4, generator=gen)  # (P, H)
    pooler = Pooler("MEAN")
    # step 1: a's first 6 tokens and all of b
    out = pooler(torch.cat([prompt_a[:6], prompt_b]), [A, B], [0, 0], [6, 3], done_rows=[1])
    assert out.sampled_token_ids == {B: [PLACEHOLDER_TOKEN]}
    torch.testing.assert_close(out.pooler_output[B], prompt_b.mean(0))
    # step 2: a's next 2 tokens (b finished); then a is preempted and recomputed from position 0
    pooler.remove(B)  # the batch forgets b (finished)
    pooler(prompt_a[6:8] * 100, [A], [6], [2], done_rows=[])  # values a preemption throws away
    pooler.remove(A)  # the batch forgets a (preempted)
    out = pooler(prompt_a[:7], [A], [0], [7], done_rows=[])
    assert out.pooler_output == {}
    out = pooler(prompt_a[7:], [A], [7], [3], done_rows=[0])
    torch.testing.assert_close(out.pooler_output[A], prompt_a.mean(0))


def test_last_token_and_lost_chunks():
    hidden = torch.arange(12.0).view(6, 2)  # a: rows 0-3, b: rows 4-5
    out = Pooler("LAST")(hidden, [A, B], [5, 0], [4, 2], done_rows=[0, 1])
    assert out.pooler_output[A].tolist() == [6.0, 7.0] and out.pooler_output[B].tolist() == [10.0, 11.0]
    with pytest.raises(RuntimeError, match="lost its earlier chunks"):
        Pooler("MEAN")(hidden[:2], [A], [4], [2], done_rows=[0])
    with pytest.raises(ValueError, match="pooling_type='CLS'"):
        Pooler("CLS")
