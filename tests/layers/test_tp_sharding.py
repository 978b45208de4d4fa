"""Tensor-parallel layers load only their rank's shard, reading only those rows
or columns from a lazy safetensors slice.

The rank and size are faked (the layers read them when built), so this runs in
one process; tests/executor checks the sharded layers compute the same model.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from minivllm.layers import embedding, linear
from minivllm.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minivllm.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)


class RecordingSlice:
    """A safetensors slice that remembers which index ranges were read."""

    def __init__(self, slice_) -> None:
        self.slice, self.reads = slice_, []

    def get_shape(self):
        return self.slice.get_shape()

    def __getitem__(self, index):
        self.reads.append(index)
        return self.slice[index]


@pytest.fixture
def tensors(tmp_path):
    gen = torch.Generator().manual_seed(0)
    data = {
        "w": torch.randn(8, 6, generator=gen),
        "b": torch.randn(8, generator=gen),
        "gate": torch.randn(4, 6, generator=gen),
        "up": torch.randn(4, 6, generator=gen),
        "q": torch.randn(4 * 2, 6, generator=gen),  # 4 heads of head_dim 2
        "k1": torch.randn(1 * 2, 6, generator=gen),  # 1 KV head
        "v1": torch.randn(1 * 2, 6, generator=gen),
        "emb": torch.randn(7, 6, generator=gen),  # vocabulary 7: not divisible by 2
    }
    path = tmp_path / "t.safetensors"
    save_file(data, str(path))
    with safe_open(str(path), framework="pt") as f:
        yield data, (lambda name: RecordingSlice(f.get_slice(name)))


def as_rank(monkeypatch, rank: int, size: int) -> None:
    for module in (linear, embedding):
        monkeypatch.setattr(module, "tp_rank", lambda: rank)
        monkeypatch.setattr(module, "tp_size", lambda: size)


def rows_read(recording: RecordingSlice, dim: int = 0) -> list[tuple[int, int]]:
    return [(idx[dim].start, idx[dim].stop) for idx in recording.reads]


@pytest.mark.parametrize("rank", [0, 1])
def test_column_parallel_reads_its_rows(monkeypatch, tensors, rank):
    data, open_slice = tensors
    as_rank(monkeypatch, rank, 2)
    layer = ColumnParallelLinear(6, 8, bias=True)
    w, b = open_slice("w"), open_slice("b")
    layer.weight_loader(layer.weight, w)
    layer.weight_loader(layer.bias, b)
    rows = slice(4 * rank, 4 * rank + 4)
    assert torch.equal(layer.weight.data, data["w"][rows]) and torch.equal(layer.bias.data, data["b"][rows])
    assert rows_read(w) == [(rows.start, rows.stop)] and rows_read(b) == [(rows.start, rows.stop)]


@pytest.mark.parametrize("rank", [0, 1])
def test_row_parallel_reads_its_columns_and_keeps_the_whole_bias(monkeypatch, tensors, rank):
    data, open_slice = tensors
    as_rank(monkeypatch, rank, 2)
    layer = RowParallelLinear(6, 8, bias=True)
    w = open_slice("w")
    layer.weight_loader(layer.weight, w)
    layer.weight_loader(layer.bias, data["b"])
    cols = slice(3 * rank, 3 * rank + 3)
    assert torch.equal(layer.weight.data, data["w"][:, cols]) and torch.equal(layer.bias.data, data["b"])
    assert rows_read(w, dim=1) == [(cols.start, cols.stop)]


@pytest.mark.parametrize("rank", [0, 1])
def test_merged_column_keeps_its_slice_of_each_member(monkeypatch, tensors, rank):
    data, open_slice = tensors
    as_rank(monkeypatch, rank, 2)
    layer = MergedColumnParallelLinear(6, [4, 4], bias=False)
    gate, up = open_slice("gate"), open_slice("up")
    layer.weight_loader(layer.weight, gate, 0)
    layer.weight_loader(layer.weight, up, 1)
    rows = slice(2 * rank, 2 * rank + 2)
    assert torch.equal(layer.weight.data, torch.cat([data["gate"][rows], data["up"][rows]]))
    assert rows_read(gate) == rows_read(up) == [(rows.start, rows.stop)]


@pytest.mark.parametrize("rank", [0, 1])
def test_qkv_splits_query_heads_and_replicates_a_lone_kv_head(monkeypatch, tensors, rank):
    data, open_slice = tensors
    as_rank(monkeypatch, rank, 2)
    layer = QKVParallelLinear(6, head_dim=2, num_heads=4, num_kv_heads=1, bias=False)
    assert (layer.num_heads, layer.num_kv_heads, layer.kv_replicas) == (2, 1, 2)
    q, k, v = open_slice("q"), open_slice("k1"), open_slice("v1")
    for shard, loaded in zip("qkv", (q, k, v)):
        layer.weight_loader(layer.weight, loaded, shard)
    q_rows = slice(4 * rank, 4 * rank + 4)  # query heads 2*rank, 2*rank+1
    assert torch.equal(layer.weight.data, torch.cat([data["q"][q_rows], data["k1"], data["v1"]]))
    assert rows_read(q) == [(q_rows.start, q_rows.stop)]


@pytest.mark.parametrize("rank", [0, 1])
def test_qkv_accepts_a_fused_checkpoint_tensor(monkeypatch, tensors, rank):
    data, _ = tensors
    as_rank(monkeypatch, rank, 2)
    layer = QKVParallelLinear(6, head_dim=2, num_heads=4, num_kv_heads=2, bias=False)
    k2, v2 = torch.cat([data["k1"], data["v1"]]), torch.cat([data["v1"], data["k1"]])  # two KV heads each
    layer.weight_loader(layer.weight, torch.cat([data["q"], k2, v2]))
    q_rows, kv_rows = slice(4 * rank, 4 * rank + 4), slice(2 * rank, 2 * rank + 2)
    assert torch.equal(layer.weight.data, torch.cat([data["q"][q_rows], k2[kv_rows], v2[kv_rows]]))


@pytest.mark.parametrize("rank", [0, 1])
def test_vocab_shards_pad_the_last_one(monkeypatch, tensors, rank):
    data, open_slice = tensors
    as_rank(monkeypatch, rank, 2)
    for layer in (VocabParallelEmbedding(7, 6), ParallelLMHead(7, 6)):
        emb = open_slice("emb")
        layer.weight_loader(layer.weight, emb)
        assert layer.weight.shape == (4, 6)
        expected = data["emb"][4 * rank : 4 * rank + 4]
        assert torch.equal(layer.weight.data[: len(expected)], expected)
        assert torch.count_nonzero(layer.weight.data[len(expected) :]) == 0  # padding rows of the last shard
        assert rows_read(emb) == [(4 * rank, 4 * rank + len(expected))]


def test_indivisible_shapes_are_rejected(monkeypatch):
    as_rank(monkeypatch, 0, 2)
    with pytest.raises(ValueError, match="attention heads=3 is not divisible by the tensor-parallel size 2"):
        QKVParallelLinear(6, head_dim=2, num_heads=3, num_kv_heads=3)
    as_rank(monkeypatch, 0, 4)
    with pytest.raises(ValueError, match="over KV heads"):
        QKVParallelLinear(6, head_dim=2, num_heads=4, num_kv_heads=3)
