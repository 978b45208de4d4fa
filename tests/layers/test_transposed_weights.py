"""GPT-2's Conv1D weights, stored (in, out), load through ``Transposed`` into the
shared linear layers, including the shard a tensor-parallel rank would read."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from minivllm.layers import linear
from minivllm.layers.weight_utils import Transposed

IN, OUT = 6, 8


@pytest.fixture
def conv1d_slice(tmp_path):
    """A (IN, OUT) Conv1D weight on disk, opened as a lazy safetensors slice."""
    weight = torch.arange(IN * OUT, dtype=torch.float32).view(IN, OUT)
    save_file({"w": weight}, str(tmp_path / "w.safetensors"))
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        yield weight, f.get_slice("w")


def _as_rank(monkeypatch, rank: int, world: int) -> None:
    monkeypatch.setattr(linear, "tp_rank", lambda: rank)
    monkeypatch.setattr(linear, "tp_size", lambda: world)


def test_transposed_reads_like_the_linear_weight(conv1d_slice):
    weight, lazy = conv1d_slice
    view = Transposed(lazy)
    assert view.get_shape() == (OUT, IN)
    torch.testing.assert_close(view[:], weight.t())
    torch.testing.assert_close(view[2:5, 1:3], weight.t()[2:5, 1:3])


@pytest.mark.parametrize("rank", [0, 1])
def test_column_and_row_shards_of_a_transposed_weight(conv1d_slice, monkeypatch, rank):
    weight, lazy = conv1d_slice
    _as_rank(monkeypatch, rank, world=2)
    column = linear.ColumnParallelLinear(IN, OUT, bias=False)
    column.weight_loader(column.weight, Transposed(lazy))
    torch.testing.assert_close(column.weight.data, weight.t()[rank * 4 : rank * 4 + 4])
    row = linear.RowParallelLinear(OUT, IN, bias=False)  # its (IN, OUT) weight is the Conv1D's (OUT, IN)^T
    row_weight = torch.arange(OUT * IN, dtype=torch.float32).view(OUT, IN)
    row.weight_loader(row.weight, Transposed(row_weight))
    torch.testing.assert_close(row.weight.data, row_weight.t()[:, rank * 4 : rank * 4 + 4])


def test_fused_qkv_from_a_transposed_conv1d_weight(monkeypatch):
    """c_attn: one (hidden, 3 * hidden) tensor feeding QKVParallelLinear's fused path."""
    _as_rank(monkeypatch, 1, world=2)
    hidden, heads, head_dim = 8, 4, 2
    c_attn = torch.randn(hidden, 3 * hidden)
    qkv = linear.QKVParallelLinear(hidden, head_dim, heads, heads, bias=False)
    qkv.weight_loader(qkv.weight, Transposed(c_attn))
    q, k, v = c_attn.t().split(hidden)
    torch.testing.assert_close(qkv.weight.data, torch.cat([q[4:], k[4:], v[4:]]))


def test_transposed_rejects_a_vector():
    with pytest.raises(ValueError, match="expected a 2-D tensor"):
        Transposed(torch.zeros(4))
