"""Attention sinks (gpt-oss): one learned logit per head that joins the softmax's denominator
and contributes no value. Both backends against a float64 reference over the unpaged
sequences, on the batches of ``test_triton_paged_attention.py`` (decode, prefill chunks,
sliding windows, GQA, split-KV); the Triton kernels run in the interpreter on the CPU."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from minivllm.attention.backend import AttentionBackend, check_no_sinks
from minivllm.attention.kv_quant import FP8_KV_DTYPE, dequantize_fp8, quantize_fp8
from minivllm.attention.ops import paged_attention
from minivllm.attention.torch_backend import TorchAttentionBackend, write_kv
from minivllm.attention.triton_backend import TritonAttentionBackend
from minivllm.layers.attention import Attention
from tests.attention.test_triton_paged_attention import (
    DEVICES,
    TOLERANCE,
    Batch,
    Case,
    expected_cache,
    make_batch,
    param,
)

CASES = [
    param("decode-gqa", (9, 1), (17, 1), (33, 1), num_heads=8, num_kv_heads=2, block_size=8),
    param("mixed", (17, 1), (20, 9), (5, 5), num_heads=4, num_kv_heads=2, block_size=8),
    param("window-mixed", (30, 1), (19, 12), (6, 6), block_size=8, sliding_window=5),
    param("decode-bf16", (31, 1), (12, 1), num_heads=8, dtype=torch.bfloat16),
    param("split4-decode", (200, 1), (65, 1), (9, 1), num_splits=4),
    param("split2-mixed-window", (90, 20), (120, 1), block_size=8, sliding_window=50, num_splits=2),
]


def make_sinks(case: Case, device: str, seed: int = 1) -> torch.Tensor:
    """(H,) logits of the scores' size, one large enough to take most of its head's mass."""
    sinks = 2.0 * torch.randn(case.num_heads, generator=torch.Generator().manual_seed(seed))
    sinks[0] = 6.0
    return sinks.to(case.dtype).to(device)


def reference_with_sinks(batch: Batch, sinks: torch.Tensor) -> torch.Tensor:
    """(T_real, H, D) float64: softmax over [scores, sink], the sink's column dropped."""
    case = batch.case
    group = case.num_heads // case.num_kv_heads
    outs = []
    queries = batch.query.split(list(case.query_lens) + [case.num_pad])
    for q, k, v in zip(queries, batch.keys, batch.values):
        q_len, seq_len = q.shape[0], k.shape[0]
        k = k.double().repeat_interleave(group, dim=1)
        v = v.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q.double(), k) / math.sqrt(case.head_dim)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        visible = k_pos <= q_pos
        if case.sliding_window is not None:
            visible &= q_pos - k_pos < case.sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        sink = sinks.double().view(-1, 1, 1).expand(-1, q_len, 1)  # (H, L, 1)
        probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
        outs.append(torch.einsum("hqk,khd->qhd", probs, v))
    return torch.cat(outs)


def assert_close_to_reference(out: torch.Tensor, batch: Batch, sinks: torch.Tensor) -> None:
    num_real = out.shape[0] - batch.case.num_pad
    atol, rtol = TOLERANCE[batch.case.dtype]
    torch.testing.assert_close(out[:num_real].double(), reference_with_sinks(batch, sinks), atol=atol, rtol=rtol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_paged_attention_kernel_applies_sinks(case: Case, device: str) -> None:
    batch = make_batch(case, device)
    sinks = make_sinks(case, device)
    out = paged_attention(
        batch.query,
        expected_cache(batch, batch.kv_cache),
        batch.meta.query_start_loc,
        batch.meta.seq_lens,
        batch.meta.block_tables,
        max_query_len=batch.meta.max_query_len,
        max_seq_len=batch.meta.max_seq_len,
        scale=1 / math.sqrt(case.head_dim),
        sliding_window=case.sliding_window,
        num_splits=case.num_splits,
        sinks=sinks,
    )
    assert_close_to_reference(out, batch, sinks)
    # The sinks change the result: the same call without them is the plain softmax, which differs.
    assert not torch.allclose(out.double(), reference_with_sinks(batch, torch.full_like(sinks, -1e4)), atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend_cls", [TorchAttentionBackend, TritonAttentionBackend])
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[2], dataclasses.replace(CASES[3].values[0], num_pad=2)])
def test_backends_write_then_attend_with_sinks(case, backend_cls, device: str) -> None:
    if backend_cls is TorchAttentionBackend and device != "cpu":
        pytest.skip("the torch backend is tested on the CPU")
    batch = make_batch(case, device)
    if backend_cls is TorchAttentionBackend:  # it multiplies whole gathered blocks: the engine's cache is
        batch.kv_cache.nan_to_num_(0.0)  # zero-filled, never NaN, past a request's end
    sinks = make_sinks(case, device)
    out = backend_cls().forward(
        batch.query,
        batch.new_key,
        batch.new_value,
        batch.kv_cache,
        batch.meta,
        scale=1 / math.sqrt(case.head_dim),
        sliding_window=case.sliding_window,
        sinks=sinks,
    )
    assert out.shape == batch.query.shape and out.dtype == case.dtype
    assert_close_to_reference(out, batch, sinks)


def test_a_backend_without_sinks_is_refused() -> None:
    class NoSinks(AttentionBackend):
        name = "no-sinks"

        def forward(self, query, key, value, kv_cache, meta, *, scale, sliding_window=None, **kwargs):
            check_no_sinks(self, kwargs.get("sinks"))
            return query

    with pytest.raises(NotImplementedError, match="'no-sinks' attention backend has no attention sinks"):
        NoSinks().forward(None, None, None, None, None, scale=1.0, sinks=torch.zeros(2))

    class OldSignature(AttentionBackend):
        def forward(self, query, key, value, kv_cache, meta, *, scale, sliding_window=None, logits_soft_cap=None):
            return query

    with pytest.raises(ValueError, match="OldSignature takes no attention sinks"):
        Attention(OldSignature(), 4, 8, 2, 1.0, sinks=True)
    assert Attention(OldSignature(), 4, 8, 2, 1.0).sinks is None  # without sinks nothing changes


@pytest.mark.parametrize("backend_cls", [TorchAttentionBackend, TritonAttentionBackend])
def test_sinks_over_an_fp8_cache(backend_cls) -> None:
    """The sink joins the softmax of keys read back from fp8 (times their scales), in both backends."""
    if backend_cls is TritonAttentionBackend and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton kernels run on the CPU only in the interpreter")
    case = CASES[1].values[0]
    batch = make_batch(case, "cpu")
    k_scale, v_scale = 0.5, 0.25
    cache = torch.zeros(batch.kv_cache.shape, dtype=FP8_KV_DTYPE)
    write_kv(torch.cat(batch.keys), torch.cat(batch.values), cache, torch.cat(batch.slots), k_scale, v_scale)
    sinks = make_sinks(case, "cpu")
    out = backend_cls().forward(
        batch.query,
        batch.new_key,
        batch.new_value,
        cache,
        batch.meta,
        scale=1 / math.sqrt(case.head_dim),
        k_scale=k_scale,
        v_scale=v_scale,
        sinks=sinks,
    )
    read_back = dataclasses.replace(
        batch,
        keys=[dequantize_fp8(quantize_fp8(k, k_scale), k_scale, torch.float32) for k in batch.keys],
        values=[dequantize_fp8(quantize_fp8(v, v_scale), v_scale, torch.float32) for v in batch.values],
    )
    assert_close_to_reference(out, read_back, sinks)
