"""The torch backend's batched decode (whole-block gathers) against attention written out per request."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from minivllm.attention.backend import AttentionMetadata
from minivllm.attention.torch_backend import TorchAttentionBackend, _CausalRows, write_kv


def _reference(q, kv_cache, table, seq_len, scale, window, soft_cap):
    """One query at position seq_len - 1, keys at positions 0..seq_len-1 read slot by slot."""
    block_size = kv_cache.shape[2]
    slots = [table[p // block_size] * block_size + p % block_size for p in range(seq_len)]
    k = kv_cache[0].reshape(-1, *kv_cache.shape[-2:])[slots]  # (L, Hkv, D)
    v = kv_cache[1].reshape(-1, *kv_cache.shape[-2:])[slots]
    group = q.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (L, H, D)
    scores = torch.einsum("hd,lhd->hl", q.double(), k.double()) * scale
    if soft_cap is not None:
        scores = soft_cap * torch.tanh(scores / soft_cap)
    if window is not None:
        scores[:, : max(0, seq_len - window)] = float("-inf")
    return torch.einsum("hl,lhd->hd", scores.softmax(-1), v.double())


@pytest.mark.parametrize("window, soft_cap", [(None, None), (5, None), (None, 2.0)])
@pytest.mark.parametrize(
    "seq_lens",  # one block, partial blocks, a block boundary; then all in one group (its output is the step's)
    [[1, 7, 13, 4], [5, 7, 8, 6]],
)
def test_batched_decode_matches_per_request_attention(window, soft_cap, seq_lens):
    gen = torch.Generator().manual_seed(0)
    H, Hkv, D, block_size, num_blocks = 4, 2, 8, 4, 40
    kv_cache = torch.randn(2, num_blocks, block_size, Hkv, D, generator=gen)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, used = [], 0
    for n in seq_lens:
        nb = -(-n // block_size)
        tables.append(perm[used : used + nb])
        used += nb
    width = max(len(t) for t in tables)
    table_arr = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    slot_mapping = torch.tensor(
        [t[(n - 1) // block_size] * block_size + (n - 1) % block_size for t, n in zip(tables, seq_lens)]
    )
    B = len(seq_lens)
    meta = AttentionMetadata(
        slot_mapping=slot_mapping,
        query_start_loc=torch.arange(B + 1, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=table_arr,
        max_query_len=1,
        max_seq_len=max(seq_lens),
        query_lens_cpu=[1] * B,
        seq_lens_cpu=seq_lens,
    )
    q = torch.randn(B, H, D, generator=gen)
    k_new, v_new = torch.randn(B, Hkv, D, generator=gen), torch.randn(B, Hkv, D, generator=gen)
    out = TorchAttentionBackend().forward(
        q, k_new, v_new, kv_cache, meta, scale=0.3, sliding_window=window, logits_soft_cap=soft_cap
    )
    for i in range(B):
        expected = _reference(q[i], kv_cache, tables[i], seq_lens[i], 0.3, window, soft_cap)
        torch.testing.assert_close(out[i].double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("has_padding", [None, True])
def test_write_kv_skips_padding_slots_whether_told_or_not(has_padding):
    gen = torch.Generator().manual_seed(1)
    kv_cache = torch.zeros(2, 4, 2, 1, 3)  # 8 slots of (1, 3)
    key, value = torch.randn(3, 1, 3, generator=gen), torch.randn(3, 1, 3, generator=gen)
    write_kv(key, value, kv_cache, torch.tensor([5, -1, 2]), has_padding=has_padding)
    flat = kv_cache.view(2, 8, 1, 3)
    assert torch.equal(flat[0, 5], key[0]) and torch.equal(flat[0, 2], key[2])
    assert torch.equal(flat[1, 5], value[0]) and torch.equal(flat[1, 2], value[2])
    assert int((flat != 0).any(-1).any(-1).sum()) == 4  # nothing else written (the -1 row is not stored at slot 7)


def _comparison_mask(q_pos: torch.Tensor, num_keys: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, Q, 1) positions -> (B, 1, Q, L) additive causal mask, by comparing positions."""
    hidden = torch.arange(num_keys).view(1, 1, -1) > q_pos
    return torch.zeros(hidden.shape, dtype=dtype).masked_fill_(hidden, float("-inf")).unsqueeze(1)


def test_causal_rows_equal_comparison_masks_as_the_tables_grow():
    rows = _CausalRows(max_len=200)  # one object serving three dtypes, as one backend does
    gen = torch.Generator().manual_seed(2)
    for num_keys in (16, 100, 40, 200):  # grows past its first size, then to its cap; a smaller range reuses it
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            q_pos = torch.randint(0, num_keys, (5, 3, 1), generator=gen)
            mask = rows.lookup(q_pos, num_keys, dtype)
            assert mask.dtype == dtype and torch.equal(mask, _comparison_mask(q_pos, num_keys, dtype))
    assert (
        rows.lookup(torch.zeros(1, 1, 1, dtype=torch.long), 201, torch.float32) is None
    )  # past the cap: the caller compares


@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 5, 1]])  # decode only; a prefill chunk between decodes
def test_masks_past_the_table_cap_give_the_same_attention(query_lens):
    """Key ranges longer than the table's cap fall back to comparisons: same output, bit for bit."""
    gen = torch.Generator().manual_seed(3)
    H, Hkv, D, block_size, num_blocks = 4, 2, 8, 4, 24
    seq_lens = [9, 14, 6]
    kv_cache = torch.randn(2, num_blocks, block_size, Hkv, D, generator=gen)
    tables = torch.arange(num_blocks, dtype=torch.int32).view(len(seq_lens), -1)  # 8 blocks each
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    slots = [
        int(tables[i, p // block_size]) * block_size + p % block_size
        for i, (n, L) in enumerate(zip(query_lens, seq_lens))
        for p in range(L - n, L)
    ]

    def run(max_len: int, host=list) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=tables,
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            query_lens_cpu=host(query_lens),
            seq_lens_cpu=host(seq_lens),
        )
        backend = TorchAttentionBackend()
        backend.causal_rows = _CausalRows(max_len=max_len)
        g = torch.Generator().manual_seed(4)
        T = starts[-1]
        q, k, v = (torch.randn(T, h, D, generator=g) for h in (H, Hkv, Hkv))
        return backend.forward(q, k, v, kv_cache.clone(), meta, scale=0.3)

    assert torch.equal(run(max_len=1024), run(max_len=4))
    as_runner_gives_them = partial(np.asarray, dtype=np.int32)  # host copies as numpy arrays, not lists
    assert torch.equal(run(max_len=1024, host=as_runner_gives_them), run(max_len=1024))
