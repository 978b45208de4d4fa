"""The Triton shrink/expand kernels (the interpreter on a CPU machine) against the torch reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.lora.punica import LoRAStepContext, add_lora
from minivllm.lora.triton_ops import lora_shrink_expand, segmented_matmul


def _case(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    slots, t, k, r, n = 3, 21, 40, 8, 36  # T, K, N off the block sizes: masked tails
    x = torch.randn(t, k, generator=gen).to(dtype)
    a = torch.randn(slots, k, r, generator=gen).to(dtype)
    b = torch.randn(slots, r, n, generator=gen).to(dtype)
    token_slots = np.random.default_rng(seed).integers(-1, slots, t)  # -1: no adapter
    ctx = LoRAStepContext()
    ctx.set_token_slots(token_slots, torch.device("cpu"))
    return x, a, b, ctx


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_shrink_expand_matches_torch_reference(dtype, tol):
    x, a, b, ctx = _case(dtype)
    base = torch.randn(x.shape[0], 50, generator=torch.Generator().manual_seed(3)).to(dtype)
    expected = base.float().clone()
    add_lora(expected[:, 7:43], x.float(), a.float(), b.float(), ctx.groups)
    out = base.clone()
    lora_shrink_expand(out[:, 7:43], x, a, b, *ctx.segments())
    assert not torch.equal(out, base)
    torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol * expected.abs().max().item())


def test_rejects_shapes_that_do_not_chain():
    x, a, b, ctx = _case(torch.float32)
    with pytest.raises(ValueError, match="do not chain"):
        segmented_matmul(x, b, torch.zeros(x.shape[0], 8), *ctx.segments(), add=False)
