"""The CPU's fp32 panel GEMM (``quantization/cpu_panel_gemm.py``): the packed layout, and the product
equal to ``F.linear`` over the shapes its loops split on: rows around the 8-row tile, output features
around the 48-column panel (a partial last panel), an inner dimension over the 1024 chunk (the
accumulation across chunks and the prefetch of the next chunk), threads splitting the panels, a bias,
strided and batched inputs, no rows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minivllm.quantization import cpu_panel_gemm
from minivllm.quantization.cpu_panel_gemm import K_CHUNK, PANEL, pack_panels, panel_linear

pytestmark = pytest.mark.skipif(cpu_panel_gemm.load() is None, reason="no C compiler to build the kernel")


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_layout_is_column_panels_padded_with_zeros():
    w = torch.arange(100 * 7, dtype=torch.float32).view(100, 7)
    packed = pack_panels(w)
    assert packed.out_features == 100 and packed.panels.shape == (3, 7, PANEL)
    for n in (0, 47, 48, 99):
        assert torch.equal(packed.panels[n // PANEL, :, n % PANEL], w[n])
    assert packed.panels[2, :, 100 - 2 * PANEL :].abs().max() == 0
    assert packed.nbytes == 3 * 7 * PANEL * 4


@pytest.mark.parametrize("out_features", [1, 48, 100, 245])
@pytest.mark.parametrize("inner", [3, 64, K_CHUNK + 37])
@pytest.mark.parametrize("rows", [1, 2, 7, 8, 9, 17, 40])
def test_equals_f_linear(out_features, inner, rows, threads):
    gen = torch.Generator().manual_seed(out_features * 1000 + inner + rows)
    w = torch.randn(out_features, inner, generator=gen)
    b = torch.randn(out_features, generator=gen)
    x = torch.randn(rows, inner, generator=gen)
    packed = pack_panels(w)
    for num_threads in (1, 2):
        threads(num_threads)
        for bias in (None, b):
            torch.testing.assert_close(panel_linear(x, packed, bias), F.linear(x, w, bias), rtol=1e-4, atol=1e-4)


def test_threads_split_a_large_product_the_same_way(threads):
    """Large enough for two threads (2**21 multiply-adds each): the same sums as one thread, bit for bit."""
    gen = torch.Generator().manual_seed(3)
    w, x = torch.randn(1000, 700, generator=gen), torch.randn(33, 700, generator=gen)
    packed = pack_panels(w)
    threads(1)
    one = panel_linear(x, packed, None)
    threads(2)
    assert torch.equal(panel_linear(x, packed, None), one)
    torch.testing.assert_close(one, F.linear(x, w), rtol=1e-4, atol=1e-4)


def test_strided_batched_and_empty_inputs():
    gen = torch.Generator().manual_seed(5)
    w, b = torch.randn(60, 40, generator=gen), torch.randn(60, generator=gen)
    packed = pack_panels(w)
    wide = torch.randn(6, 50, generator=gen)[:, 5:45]  # rows 50 apart
    torch.testing.assert_close(panel_linear(wide, packed, b), F.linear(wide, w, b), rtol=1e-5, atol=1e-5)
    xt = torch.randn(40, 6, generator=gen).t()  # columns not contiguous
    torch.testing.assert_close(panel_linear(xt, packed, b), F.linear(xt, w, b), rtol=1e-5, atol=1e-5)
    x3 = torch.randn(2, 3, 40, generator=gen)
    torch.testing.assert_close(panel_linear(x3, packed, b), F.linear(x3, w, b), rtol=1e-5, atol=1e-5)
    assert panel_linear(torch.empty(0, 40), packed, b).shape == (0, 60)


def test_a_non_contiguous_weight_packs_as_its_values():
    w = torch.randn(40, 96).t()  # (96, 40) with strides (1, 96)
    x = torch.randn(5, 40)
    torch.testing.assert_close(panel_linear(x, pack_panels(w), None), F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_a_smaller_team_than_asked_for_still_computes_every_panel():
    """OpenMP may give fewer threads than asked (here OMP_THREAD_LIMIT=1 while torch asks for 2): each
    thread's share follows the team it got, so no panel is left out."""
    code = (
        "import torch, torch.nn.functional as F\n"
        "from minivllm.quantization.cpu_panel_gemm import pack_panels, panel_linear\n"
        "torch.set_num_threads(2)\n"
        "g = torch.Generator().manual_seed(0)\n"
        "w, x = torch.randn(1000, 700, generator=g), torch.randn(33, 700, generator=g)\n"
        "torch.testing.assert_close(panel_linear(x, pack_panels(w), None), F.linear(x, w), rtol=1e-4, atol=1e-4)\n"
    )
    env = {**os.environ, "OMP_THREAD_LIMIT": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_bad_inputs_are_refused_and_empty_products_are_empty():
    packed = pack_panels(torch.randn(60, 40))
    with pytest.raises(ValueError, match="float32 with 40"):
        panel_linear(torch.randn(3, 40, dtype=torch.bfloat16), packed, None)
    with pytest.raises(ValueError, match="with 39 features"):
        panel_linear(torch.randn(3, 39), packed, None)
    none = cpu_panel_gemm.PanelWeight(torch.empty(0, 40, PANEL), 0)
    assert panel_linear(torch.randn(3, 40), none, None).shape == (3, 0)
