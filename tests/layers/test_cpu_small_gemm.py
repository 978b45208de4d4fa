"""The CPU's few-row GEMM (``quantization/cpu_small_gemm.py``): equal to F.linear to fp32 rounding for
1-4 rows at odd shapes, with a bias, strided rows and two threads; the packed layers take it at small
batches and oneDNN above; huge-page placement copies the weight exactly and only once."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minivllm.layers.linear import ReplicatedLinear
from minivllm.models.utils import pack_cpu_weights
from minivllm.quantization import cpu_small_gemm
from minivllm.quantization.base import cpu_linear, pack_cpu_weight

needs_kernel = pytest.mark.skipif(cpu_small_gemm.load() is None, reason="no C compiler to build the kernel")


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 33), (96, 40), (5, 64), (1031, 257)])
@pytest.mark.parametrize("bias", [False, True])
def test_small_linear_equals_f_linear(rows, n, k, bias):
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    x = torch.randn(rows, k, generator=gen)
    assert cpu_small_gemm.serves(x, w)
    torch.testing.assert_close(cpu_small_gemm.small_linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-4)
    wide = torch.randn(rows, k + 9, generator=gen)[:, 3 : 3 + k]  # rows k + 9 floats apart
    torch.testing.assert_close(cpu_small_gemm.small_linear(wide, w, b), F.linear(wide, w, b), rtol=1e-5, atol=1e-4)


@needs_kernel
def test_small_linear_on_two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(2051, 300, generator=gen)  # over 2**18 weights: split over the threads
        x = torch.randn(3, 300, generator=gen)
        torch.testing.assert_close(cpu_small_gemm.small_linear(x, w, None), F.linear(x, w), rtol=1e-5, atol=1e-4)
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_serves_only_few_fp32_rows():
    w = torch.randn(8, 16)
    assert not cpu_small_gemm.serves(torch.randn(5, 16), w)
    assert not cpu_small_gemm.serves(torch.randn(0, 16), w)  # no rows: the kernel is not called
    assert not cpu_small_gemm.serves(torch.randn(2, 16, dtype=torch.bfloat16), w)
    assert not cpu_small_gemm.serves(torch.randn(16, 2).t(), w)  # columns not contiguous
    assert not cpu_small_gemm.serves(torch.randn(2, 16), torch.randn(16, 8).t())
    assert not cpu_small_gemm.serves(torch.randn(1, 2, 16), w)


@needs_kernel
@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_cpu_linear_routes_by_rows():
    """One row reads the plain weight against fp32 panels, up to SMALL_ROWS against oneDNN's copy."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(64, 48, generator=gen)
    zeros = torch.zeros_like(w)  # the plain weight the few rows read, the packed copy the rest
    panels = pack_cpu_weight(w)
    onednn = torch.ops.mkldnn._reorder_linear_weight(w, 32)
    for packed, few in ((panels, 1), (onednn, cpu_small_gemm.SMALL_ROWS)):
        assert cpu_linear(torch.randn(few, 48, generator=gen), zeros, packed, None).abs().max() == 0
        x = torch.randn(few + 1, 48, generator=gen)
        torch.testing.assert_close(cpu_linear(x, zeros, packed, None), F.linear(x, w), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_huge_page_placement_copies_once():
    w = torch.randn(1024, 1536)  # 6 MiB: three whole huge pages
    placed = cpu_small_gemm.to_huge_pages(w)
    assert placed.data_ptr() % (2 << 20) == 0 and placed.data_ptr() != w.data_ptr()
    assert torch.equal(placed, w)
    assert cpu_small_gemm.to_huge_pages(placed) is placed  # already placed: no second copy
    small = torch.randn(8, 8)
    assert cpu_small_gemm.to_huge_pages(small) is small


@needs_kernel
def test_packed_layer_keeps_its_weight_and_forwards_as_before():
    torch.manual_seed(0)
    layer = ReplicatedLinear(1024, 600, bias=True)
    for p in layer.parameters():
        p.data.normal_()
    x = torch.randn(1, 1024)  # one row: the plain weight's kernel
    want = F.linear(x, layer.weight, layer.bias)
    param = layer.weight
    assert pack_cpu_weights(torch.nn.ModuleList([layer])) == 1
    assert layer.weight is param and layer.weight.data_ptr() % (2 << 20) == 0  # moved into huge pages
    torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-4)
    layer.weight.data.zero_()  # an in-place weight update reaches the few-row path
    assert layer(x).sub(layer.bias).abs().max() == 0
