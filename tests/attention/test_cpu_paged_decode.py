"""The CPU decode kernel that reads the paged cache in place, against the torch backend's block gathers."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from minivllm.attention import cpu_paged_decode
from minivllm.attention.backend import AttentionMetadata
from minivllm.attention.torch_backend import PagedDecode, TorchAttentionBackend
from minivllm.c_kernels import UNLOADED

needs_kernel = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler to build the CPU kernel"
)


def _step(gen, query_lens, seq_lens, H, Hkv, D, block_size, dtype=torch.float32, fused_qkv=False):
    """A random step: a cache with shuffled blocks, the step's metadata, and its q, k, v."""
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 3
    kv_cache = torch.randn(2, num_blocks, block_size, Hkv, D, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, used = [], 0
    for n in seq_lens:
        nb = -(-n // block_size)
        tables.append(perm[used : used + nb])
        used += nb
    width = max(len(t) for t in tables) + 2  # unused entries past each request's blocks, as the runner has
    table_arr = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    slots = [
        t[p // block_size] * block_size + p % block_size
        for t, q, n in zip(tables, query_lens, seq_lens)
        for p in range(n - q, n)
    ]
    starts = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.from_numpy(starts),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=table_arr,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=np.asarray(query_lens, dtype=np.int32),
        seq_lens_cpu=np.asarray(seq_lens, dtype=np.int32),
        query_start_loc_cpu=starts,
        block_tables_cpu=table_arr.numpy(),
    )
    T = int(starts[-1])
    if fused_qkv:  # q, k, v as views of one projection output, as the models pass them
        qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=gen)
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q, k, v = q.view(T, H, D), k.view(T, Hkv, D), v.view(T, Hkv, D)
    else:
        q, k, v = (torch.randn(T, h, D, generator=gen) for h in (H, Hkv, Hkv))
    return kv_cache, meta, q, k, v


def _run(monkeypatch, kernel: bool, kv_cache, meta, q, k, v, **kw):
    if not kernel:
        monkeypatch.setattr(cpu_paged_decode.LIBRARY, "loaded", None)
    backend = TorchAttentionBackend()
    meta.backend_data = backend.prepare(meta, kv_cache.shape[2])
    out = backend.forward(q, k, v, kv_cache.clone(), meta, **kw)
    monkeypatch.undo()
    return out, meta.backend_data


@needs_kernel
@pytest.mark.parametrize("window, soft_cap", [(None, None), (6, None), (None, 3.0), (4, 2.0)])
@pytest.mark.parametrize(
    "query_lens, seq_lens",
    [
        ([1, 1, 1, 1], [1, 17, 16, 40]),  # decode only: one token, a block boundary, partial blocks
        ([1, 9, 1, 5], [30, 9, 7, 21]),  # decode between a whole prefill and a chunk after a cached prefix
        ([12], [12]),  # prefill only: no decode entry
        ([1], [33]),  # one request
    ],
)
@pytest.mark.parametrize("H, Hkv, D, block_size", [(4, 2, 8, 4), (12, 4, 64, 16), (3, 3, 16, 8), (8, 1, 32, 2)])
def test_in_place_decode_matches_block_gathers(
    monkeypatch, window, soft_cap, query_lens, seq_lens, H, Hkv, D, block_size
):
    gen = torch.Generator().manual_seed(sum(seq_lens) + H)
    step = _step(gen, query_lens, seq_lens, H, Hkv, D, block_size, fused_qkv=H == 12)
    kw = dict(scale=D**-0.5, sliding_window=window, logits_soft_cap=soft_cap)
    assert cpu_paged_decode.load() is not None  # a compiler is here: the kernel must build
    got, data = _run(monkeypatch, True, *step, **kw)
    expected, _ = _run(monkeypatch, False, *step, **kw)
    assert any(isinstance(g, PagedDecode) for g in data) == (1 in query_lens)  # the kernel did run
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("window", [None, 37])  # a window that starts inside a block
@pytest.mark.parametrize(
    "H, Hkv, D, block_size",
    [
        (12, 4, 64, 16),  # the specialised head size 64, three query heads a KV head
        (16, 2, 128, 16),  # the specialised head size 128, eight a KV head
        (6, 6, 64, 32),  # no GQA
        (12, 1, 24, 8),  # a head size with no specialisation (vector remainder), MQA
    ],
)
def test_long_contexts_across_many_blocks_and_threads(monkeypatch, threads, window, H, Hkv, D, block_size):
    """Contexts of many blocks, none a whole number of blocks, with peaked scores: the online softmax
    rescales its running sums block after block, and requests split over threads."""
    gen = torch.Generator().manual_seed(H * D + block_size)
    seq_lens = [1, block_size - 1, 3 * block_size + 5, 257, 130, 2 * block_size]
    kv_cache, meta, q, k, v = _step(gen, [1] * len(seq_lens), seq_lens, H, Hkv, D, block_size)
    q = q * 4  # peaked attention: later blocks often hold a larger maximum than earlier ones
    kw = dict(scale=D**-0.5, sliding_window=window, logits_soft_cap=None)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got, data = _run(monkeypatch, True, kv_cache, meta, q, k, v, **kw)
    finally:
        torch.set_num_threads(before)
    expected, _ = _run(monkeypatch, False, kv_cache, meta, q, k, v, **kw)
    assert any(isinstance(g, PagedDecode) for g in data)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_caches_the_kernel_does_not_serve_take_the_gather_path(monkeypatch, dtype):
    gen = torch.Generator().manual_seed(5)
    kv_cache, meta, q, k, v = _step(gen, [1, 4, 1], [9, 4, 20], 4, 2, 8, 4, dtype=dtype)
    q = q.to(torch.bfloat16) if dtype == torch.bfloat16 else q
    k, v = k.to(q.dtype), v.to(q.dtype)
    got, _ = _run(monkeypatch, True, kv_cache, meta, q, k, v, scale=0.3)
    expected, _ = _run(monkeypatch, False, kv_cache, meta, q, k, v, scale=0.3)
    assert torch.equal(got, expected)


def test_a_failed_build_falls_back_to_block_gathers(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(cpu_paged_decode.LIBRARY, "loaded", UNLOADED)
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    assert cpu_paged_decode.load() is None
    assert "did not build" in caplog.text
    gen = torch.Generator().manual_seed(6)
    kv_cache, meta, q, k, v = _step(gen, [1, 1], [5, 9], 4, 2, 8, 4)
    backend = TorchAttentionBackend()
    assert not any(isinstance(g, PagedDecode) for g in backend.prepare(meta, 4))


@needs_kernel
def test_loading_the_kernel_keeps_denormals():
    """The kernel is compiled with fast math but must not switch the process to flush-to-zero."""
    assert cpu_paged_decode.load() is not None
    tiny = torch.tensor([1e-40], dtype=torch.float32)  # a denormal
    assert float(tiny * 1.0) != 0.0


@needs_kernel
def test_the_kernel_is_built_once_under_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_paged_decode.LIBRARY, "loaded", UNLOADED)
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    assert cpu_paged_decode.load() is not None
    built = list((tmp_path / "cpu_kernels").glob("paged_decode_*.so"))
    assert len(built) == 1
    monkeypatch.setattr(cpu_paged_decode.LIBRARY, "loaded", UNLOADED)
    monkeypatch.setenv("CC", "false")  # a second process finds it built: no compiler needed
    assert cpu_paged_decode.load() is not None
