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


def compile_for_cuda(arch: int = 90) -> None:
    """Compile the kernel as the wrapper launches it (bf16 x, expand into bf16), for sm_<arch>,
    down to a cubin (no GPU needed). Run without TRITON_INTERPRET: it must be a JITFunction."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from minivllm.lora.triton_ops import _segmented_matmul_kernel as kernel

    types = {"x_ptr": "*fp32", "w_ptr": "*bf16", "out_ptr": "*bf16", "idx_ptr": "*i64",
             "seg_slot_ptr": "*i32", "seg_start_ptr": "*i32", "seg_len_ptr": "*i32"}  # fmt: skip
    constexprs = {"ADD": True, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 16, "FP32_DOT": False}
    signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in kernel.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names) if n.endswith("_ptr")}
    triton.compile(ASTSource(kernel, signature, constexprs, aligned), target=GPUTarget("cuda", arch, 32))


@pytest.mark.slow
def test_kernel_compiles_for_cuda_without_a_gpu():
    """The interpreter accepts code the compiler rejects: compile for a Hopper GPU in a
    fresh process where the kernel is defined without the interpreter."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    code = "from tests.lora.test_triton_lora import compile_for_cuda; compile_for_cuda(90)"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
