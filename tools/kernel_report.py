"""Compile every Triton kernel of the package for sm_80 and sm_90 without a GPU, and
report the registers, shared memory and register spills of each compiled variant.

    PYTHONPATH=. python -m tools.kernel_report                      # sm_80 and sm_90, a table
    PYTHONPATH=. python -m tools.kernel_report --arch 90 --json report.json --jobs 2

A variant is one launch of a kernel as its wrapper makes it for a benchmark shape on a
GPU of the architecture: the wrapper's own functions choose the tiles, warps and splits
(``tile_config`` with that compute capability, ``default_num_splits``, the GEMMs' ``heuristic_tiles``,
``launch_constexprs``, ...), and the arguments (stand-in tensors of the right dtype and
shape, integers and floats of the benchmark's sizes) go through Triton's own launch-time
specialization, so the compiled kernel is the one a launch on the GPU would compile
(16-byte-aligned pointers, integers divisible by 16 or equal to 1 specialized alike).
Variants that compile to the same kernel are merged. Each is compiled with
``triton.compile`` for ``GPUTarget("cuda", arch, 32)`` down to a cubin with the ptxas
that ships with Triton; ptxas ``-v`` is then run again on the PTX to read the registers
and spills, and the shared memory is the dynamic shared memory Triton will request
(``metadata.shared``).

A variant fails when it does not compile, spills registers (any spill store or load)
or needs more shared memory than one block may have on the architecture. A variant whose
configuration the engine refuses at start-up on the architecture (an fp8 KV cache below
sm_89: ``check_fp8_kv_capability``), or that its wrapper refuses there (the fp8 activation
quantization below sm_89, where fp8 linears never launch it: ``check_fp8_quant_capability``),
is not compiled but listed as refused, with the refusal's message; that is no failure.
Run this without ``TRITON_INTERPRET``: the kernels must be JITFunctions. The exit status is 1 when any variant fails.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
ARCHS = (80, 90)
SHARED_LIMIT = {  # bytes of shared memory one block may use (opt-in maximum)
    80: 166912,  # A100: 163 KiB
    90: 232448,  # H100: 227 KiB
}
NUM_SMS = 132  # H100 SXM: the split-KV choice is made for it
MODEL_YAML = ROOT / "conf" / "model" / "qwen3-0.6b.yaml"


class Tensor:
    """A stand-in for a contiguous CUDA tensor at a launch: dtype, shape, strides and a
    16-byte-aligned address are all Triton's specialization looks at."""

    def __init__(self, dtype: torch.dtype, *shape: int) -> None:
        self.dtype, self.shape = dtype, shape
        self._strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))

    def stride(self, dim: int | None = None):
        return self._strides if dim is None else self._strides[dim]

    @staticmethod
    def data_ptr() -> int:
        return 0  # CUDA allocations are 256-byte aligned

    def __getitem__(self, index: tuple[slice, slice]) -> "Tensor":
        """``t[:, a:b]`` of a 2-D tensor: the same row stride, fewer columns."""
        rows, columns = index
        assert rows == slice(None) and len(self.shape) == 2, "only column slices of a matrix"
        view = Tensor(self.dtype, self.shape[0], len(range(*columns.indices(self.shape[1]))))
        view._strides = self._strides
        return view


@dataclass
class Variant:
    kernel: Any  # a triton JITFunction
    label: str
    args: dict[str, Any]  # every kernel argument by name, constexprs included
    options: dict[str, Any] = field(default_factory=dict)  # num_warps / num_stages if the wrapper passes them
    fp8_kv: bool = False  # part of a launch over an fp8 KV cache (refused at start-up below sm_89)
    capability_check: Callable[[tuple[int, int]], None] | None = None  # the wrapper's ValueError for a GPU

    @property
    def kernel_name(self) -> str:
        return self.kernel.fn.__name__


# --------------------------------------------------------------------------------------------
# The variants: each builder mirrors its wrapper's launch.


def model_shape() -> dict:
    import yaml

    hf = yaml.safe_load(MODEL_YAML.read_text())["hf_config"]
    return dict(
        hidden=hf["hidden_size"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf["num_key_value_heads"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        dtype=getattr(torch, hf["torch_dtype"]),
        rms_norm_eps=hf["rms_norm_eps"],
        max_position=hf["max_position_embeddings"],
    )


def capability(arch: int) -> tuple[int, int]:
    """80 -> (8, 0): the compute capability ``torch.cuda.get_device_capability`` gives on that GPU."""
    return divmod(arch, 10)


def start_up_refusal(variant: Variant, arch: int) -> str:
    """The engine's start-up error for the variant's configuration on ``arch``; "" if it starts."""
    from minivllm.attention.ops.checks import check_fp8_kv_capability

    checks = [check_fp8_kv_capability] if variant.fp8_kv else []
    if variant.capability_check is not None:
        checks.append(variant.capability_check)
    for check in checks:
        try:
            check(capability(arch))
        except ValueError as e:
            return str(e)
    return ""


def paged_attention_launches(
    label: str,
    *,
    arch: int,
    dtype: torch.dtype,
    num_reqs: int,
    query_len: int,
    context_len: int,
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    kv_dtype: torch.dtype | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    num_tokens: int | None = None,
) -> list[Variant]:
    """``paged_attention`` on a CUDA device of compute capability ``arch`` (80: 8.0) with NUM_SMS
    multiprocessors: requests of at most ``query_len`` new tokens (all of them: ``num_tokens``
    None) at the end of ``context_len`` tokens; ``num_splits`` left to the wrapper."""
    from minivllm.attention.ops import paged_attention_kernels as kernels
    from minivllm.attention.ops.paged_attention_tiles import default_num_splits, tile_config

    num_tokens = num_reqs * query_len if num_tokens is None else num_tokens
    group = num_heads // num_kv_heads
    block_q, block_n, num_warps = tile_config(
        head_dim, triton.next_power_of_2(group), query_len, dtype == torch.float32, capability(arch)
    )
    num_q_tiles = triton.cdiv(query_len, block_q)
    num_splits = default_num_splits(NUM_SMS, num_reqs * num_q_tiles * num_kv_heads, query_len, context_len)
    split_len = triton.cdiv(triton.cdiv(context_len, num_splits), block_n) * block_n
    blocks_per_req = triton.cdiv(context_len, block_size)
    query, out = Tensor(dtype, num_tokens, num_heads, head_dim), Tensor(dtype, num_tokens, num_heads, head_dim)
    kv_cache = Tensor(kv_dtype or dtype, 2, num_reqs * blocks_per_req, block_size, num_kv_heads, head_dim)
    block_tables = Tensor(torch.int32, num_reqs, blocks_per_req)
    seq_lens, query_start_loc = Tensor(torch.int32, num_reqs), Tensor(torch.int32, num_reqs + 1)
    partials = [out] * 3
    if num_splits > 1:
        partials = [Tensor(torch.float32, num_splits, num_tokens, num_heads, *shape) for shape in ((head_dim,), (), ())]
    label = f"{label} bs{block_size} split{num_splits}"
    fp8_kv = kv_dtype == torch.float8_e4m3fn  # the whole launch: the engine refuses the cache, not one kernel
    attention = Variant(
        kernels._paged_attention_kernel,
        label,
        dict(
            out_ptr=out,
            part_acc_ptr=partials[0],
            part_max_ptr=partials[1],
            part_sum_ptr=partials[2],
            q_ptr=query,
            kv_ptr=kv_cache,
            block_tables_ptr=block_tables,
            seq_lens_ptr=seq_lens,
            query_start_loc_ptr=query_start_loc,
            scale=head_dim**-0.5,
            soft_cap=soft_cap or 0.0,
            window=sliding_window or 0,
            split_len=split_len,
            num_tokens=num_tokens,
            num_heads=num_heads,
            k_scale=1.0,
            v_scale=1.0,
            stride_qt=query.stride(0),
            stride_qh=query.stride(1),
            stride_ot=out.stride(0),
            stride_oh=out.stride(1),
            stride_kv=kv_cache.stride(0),
            stride_cb=kv_cache.stride(1),
            stride_cs=kv_cache.stride(2),
            stride_ch=kv_cache.stride(3),
            stride_bt=block_tables.stride(0),
            HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            BLOCK_SIZE=block_size,
            GROUP=group,
            GROUP_PAD=triton.next_power_of_2(group),
            BLOCK_Q=block_q,
            BLOCK_N=block_n,
            NUM_SPLITS=num_splits,
            USE_WINDOW=sliding_window is not None,
            USE_SOFT_CAP=soft_cap is not None,
            FP32_DOT=dtype == torch.float32,
            FP8_KV=fp8_kv,
        ),
        dict(num_warps=num_warps),
        fp8_kv=fp8_kv,
    )
    if num_splits == 1:
        return [attention]
    combine = Variant(
        kernels._combine_splits_kernel,
        label,
        dict(
            out_ptr=out,
            part_acc_ptr=partials[0],
            part_max_ptr=partials[1],
            part_sum_ptr=partials[2],
            query_start_loc_ptr=query_start_loc,
            num_reqs=num_reqs,
            num_tokens=num_tokens,
            num_heads=num_heads,
            stride_ot=out.stride(0),
            stride_oh=out.stride(1),
            HEAD_DIM=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            NUM_SPLITS=num_splits,
        ),
        fp8_kv=fp8_kv,
    )
    return [attention, combine]


def write_kv_launch(
    label: str,
    *,
    dtype: torch.dtype,
    num_tokens: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_blocks: int,
    kv_dtype: torch.dtype | None = None,
) -> Variant:
    """``write_kv`` of the keys and values split off a fused qkv projection output."""
    from minivllm.attention.kv_quant import FP8_KV_DTYPE
    from minivllm.attention.ops import triton_kv_write as kvw

    qkv_heads = 3 * num_kv_heads  # a view of (T, H + 2 Hkv, D): strides of the fused output; H >= Hkv
    key = value = Tensor(dtype, num_tokens, qkv_heads, head_dim)
    kv_cache = Tensor(kv_dtype or dtype, 2, num_blocks, block_size, num_kv_heads, head_dim)
    fp8_kv = kv_cache.dtype == FP8_KV_DTYPE
    return Variant(
        kvw._write_kv_kernel,
        f"{label} bs{block_size}",
        dict(
            key_ptr=key,
            value_ptr=value,
            kv_ptr=kv_cache,
            slot_mapping_ptr=Tensor(torch.int64, num_tokens),
            k_scale=1.0,
            v_scale=1.0,
            stride_kt=key.stride(0),
            stride_kh=key.stride(1),
            stride_vt=value.stride(0),
            stride_vh=value.stride(1),
            stride_kv=kv_cache.stride(0),
            stride_cb=kv_cache.stride(1),
            stride_cs=kv_cache.stride(2),
            stride_ch=kv_cache.stride(3),
            **kvw.launch_constexprs(num_kv_heads, head_dim, block_size, fp8_kv, False),
        ),
        fp8_kv=fp8_kv,
    )


def _shape(
    dtype: torch.dtype, num_reqs: int, query_len: int, context_len: int, block_size: int, *, heads, **extra
) -> dict:
    """``paged_attention_launches`` keywords of one shape; ``heads``: (num_heads, num_kv_heads, head_dim)."""
    num_heads, num_kv_heads, head_dim = heads
    return dict(
        dtype=dtype,
        num_reqs=num_reqs,
        query_len=query_len,
        context_len=context_len,
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        **extra,
    )


def attention_variants(arch: int) -> list[Variant]:
    """Qwen3-0.6B's attention on ``arch`` at the shapes of benchmarks/attention.py: decode at several
    batch sizes (and so several split counts), a prefill chunk, a mixed batch, 256-token
    KV blocks, an fp8 KV cache; and four other head shapes and dtypes (fp16, fp32 at head_dim
    128 and 256, a sliding window with a soft cap) for the wrapper's other tile choices."""
    m = model_shape()
    heads = dict(num_heads=m["num_heads"], num_kv_heads=m["num_kv_heads"], head_dim=m["head_dim"])
    context, (prefill_reqs, chunk, prefill_context) = 4096, (4, 512, 2048)  # benchmarks/attention.py defaults
    bf16 = dict(dtype=m["dtype"], **heads)
    fp8 = dict(bf16, kv_dtype=torch.float8_e4m3fn)
    decode = dict(query_len=1, context_len=context)
    prefill = dict(num_reqs=prefill_reqs, query_len=chunk, context_len=prefill_context)
    prefill_label = f"prefill {prefill_reqs}x{chunk}@{prefill_context}"
    shapes: list[tuple[str, dict]] = [
        *((f"decode {b}x{context}", dict(bf16, **decode, num_reqs=b, block_size=16)) for b in (1, 16, 64, 256)),
        (prefill_label, dict(bf16, **prefill, block_size=16)),
        # A mixed step: the tiles follow the longest query, so decode rows riding with a chunk
        # take the prefill tiles.
        (
            f"mixed 63 decode + 1 chunk of {chunk}",
            dict(bf16, num_reqs=64, query_len=chunk, num_tokens=63 + chunk, context_len=context, block_size=16),
        ),
        (f"decode 1x{context}", dict(bf16, **decode, num_reqs=1, block_size=256)),
        (prefill_label, dict(bf16, **prefill, block_size=256)),
        (f"fp8-kv decode 64x{context}", dict(fp8, **decode, num_reqs=64, block_size=16)),
        (f"fp8-kv decode 1x{context}", dict(fp8, **decode, num_reqs=1, block_size=16)),
        (f"fp8-kv prefill {prefill_reqs}x{chunk}", dict(fp8, **prefill, block_size=16)),
        ("fp16 h24/8 d80 prefill 2x64@300", _shape(torch.float16, 2, 64, 300, 8, heads=(24, 8, 80))),
        (
            "fp32 h4/4 d256 window prefill 2x64@512",
            _shape(torch.float32, 2, 64, 512, 64, heads=(4, 4, 256), sliding_window=128),
        ),
        ("fp32 h16/16 d128 prefill 2x64@512", _shape(torch.float32, 2, 64, 512, 16, heads=(16, 16, 128))),
        (
            "bf16 h32/8 window+softcap decode 2x1024",
            _shape(torch.bfloat16, 2, 1, 1024, 16, heads=(32, 8, 128), sliding_window=512, soft_cap=50.0),
        ),
    ]
    out = [v for label, shape in shapes for v in paged_attention_launches(label, arch=arch, **shape)]
    kv = dict(dtype=m["dtype"], num_kv_heads=m["num_kv_heads"], head_dim=m["head_dim"])
    out.append(write_kv_launch("qwen3-0.6b 256 tokens", num_tokens=256, block_size=16, num_blocks=4096, **kv))
    out.append(write_kv_launch("qwen3-0.6b 256 tokens", num_tokens=256, block_size=256, num_blocks=256, **kv))
    out.append(
        write_kv_launch(
            "qwen3-0.6b 256 tokens fp8-kv",
            num_tokens=256,
            block_size=16,
            num_blocks=4096,
            kv_dtype=torch.float8_e4m3fn,
            **kv,
        )
    )
    return out


def layer_op_variants() -> list[Variant]:
    """RMSNorm (with and without the residual add) and rotary over Qwen3-0.6B's hidden size and heads."""
    from minivllm.layers.ops import fused_rms_norm, rotary_inplace

    m = model_shape()
    tokens, out = 256, []
    for residual in (False, True):
        x = Tensor(m["dtype"], tokens, m["hidden"])
        label = f"hidden {m['hidden']}" + (" +residual" if residual else "")
        out.append(
            Variant(
                fused_rms_norm._rms_norm_kernel,
                label,
                dict(
                    x_ptr=x,
                    residual_ptr=x,
                    weight_ptr=Tensor(m["dtype"], m["hidden"]),
                    stride_x=x.stride(0),
                    stride_r=x.stride(0) if residual else 0,
                    eps=m["rms_norm_eps"],
                    **fused_rms_norm.launch_constexprs(m["hidden"], residual),
                ),
            )
        )
    qkv = Tensor(m["dtype"], tokens, m["num_heads"] + 2 * m["num_kv_heads"], m["head_dim"])  # q and k: views of it
    cos_sin = Tensor(torch.float32, m["max_position"], m["head_dim"])  # rotary over the whole head
    out.append(
        Variant(
            rotary_inplace._rotary_kernel,
            f"neox head_dim {m['head_dim']} (q and k)",
            dict(
                x_ptr=qkv,
                positions_ptr=Tensor(torch.int64, tokens),
                cache_ptr=cos_sin,
                stride_xt=qkv.stride(0),
                stride_xh=qkv.stride(1),
                **rotary_inplace.launch_constexprs(m["head_dim"], True),
            ),
        )
    )
    return out


def _benchmark_module(name: str):
    import importlib.util

    module_name = f"_benchmark_{name}"  # benchmarks/ is no package: load the script by path
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, ROOT / "benchmarks" / f"{name}.py")
        sys.modules[module_name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def lora_variants(rank: int = 16, slots: int = 8, tokens: int = 256) -> list[Variant]:
    """``lora_shrink_expand`` on Qwen3-0.6B's q_proj (benchmarks/lora.py's rank 16): shrink
    bf16 x into the fp32 buffer, expand the buffer into a column slice of the bf16 qkv output."""
    from minivllm.lora import triton_ops

    m = model_shape()
    hidden, q_size = m["hidden"], m["num_heads"] * m["head_dim"]
    qkv_out = Tensor(m["dtype"], tokens, q_size + 2 * m["num_kv_heads"] * m["head_dim"])
    x, buffer = Tensor(m["dtype"], tokens, hidden), Tensor(torch.float32, tokens, rank)
    a, b = Tensor(m["dtype"], slots, hidden, rank), Tensor(m["dtype"], slots, rank, q_size)
    segments = dict(
        idx_ptr=Tensor(torch.int64, tokens),
        seg_slot_ptr=Tensor(torch.int32, slots),
        seg_start_ptr=Tensor(torch.int32, slots),
        seg_len_ptr=Tensor(torch.int32, slots),
    )
    out = []
    for name, src, w, dst, add in (("shrink", x, a, buffer, False), ("expand", buffer, b, qkv_out[:, :q_size], True)):
        n, k = w.shape[2], w.shape[1]
        block_m, block_n, block_k = triton_ops.block_config(n, k)
        out.append(
            Variant(
                triton_ops._segmented_matmul_kernel,
                f"{name} q_proj rank {rank}",
                dict(
                    x_ptr=src,
                    w_ptr=w,
                    out_ptr=dst,
                    **segments,
                    N=n,
                    K=k,
                    stride_xm=src.stride(0),
                    stride_ws=w.stride(0),
                    stride_wk=w.stride(1),
                    stride_om=dst.stride(0),
                    ADD=add,
                    BLOCK_M=block_m,
                    BLOCK_N=block_n,
                    BLOCK_K=block_k,
                    FP32_DOT=src.dtype == torch.float32,
                ),
            )
        )
    return out


def fp8_quant_variants() -> list[Variant]:
    """``quantize_fp8_rows`` of bf16 activations, dynamic and static, over the input sizes of
    benchmarks/quant_gemm.py's shapes (any M: the grid is one program per row) and a row
    too long for one tile (Llama-3-70B's down_proj). Refused below sm_89, as its wrapper does."""
    from minivllm.quantization import triton_fp8_quant as fq

    hiddens = sorted({shape.k for shape in _benchmark_module("quant_gemm").SHAPES}) + [28672]
    out = []
    for hidden in hiddens:
        for static in (False, True):
            x, values = Tensor(torch.bfloat16, 1024, hidden), Tensor(torch.float8_e4m3fn, 1024, hidden)
            constexprs, num_warps = fq.launch_config(hidden, static, False)
            out.append(
                Variant(
                    fq._fp8_quant_kernel,
                    f"hidden {hidden} M=1..1024 {'static' if static else 'dynamic'}",
                    dict(
                        x_ptr=x,
                        out_ptr=values,
                        scale_ptr=Tensor(torch.float32, 1024, 1),
                        static_scale_ptr=Tensor(torch.float32, 1),
                        stride_x=x.stride(0),
                        **constexprs,
                    ),
                    dict(num_warps=num_warps),
                    capability_check=fq.check_fp8_quant_capability,
                )
            )
    return out


def all_variants(arch: int) -> list[Variant]:
    """Every kernel's launches on a GPU of ``arch`` (the wrappers' choices may depend on it)."""
    from tools.gemm_variants import fused_moe_variants, int4_variants  # they build on this module's stand-ins

    gemms = fused_moe_variants(arch) + int4_variants(arch)
    return attention_variants(arch) + layer_op_variants() + gemms + lora_variants() + fp8_quant_variants()


# --------------------------------------------------------------------------------------------
# Compiling and reading the resources.


@dataclass
class Bound:
    """A variant as Triton's launch path would hand it to ``triton.compile``."""

    kernel: Any
    labels: list[str]
    signature: dict
    constexprs: dict
    attrs: dict
    options: Any
    fp8_kv: bool = False  # any of the merged variants is

    def key(self) -> str:
        return repr(
            (
                self.kernel.fn.__name__,
                self.signature,
                sorted(self.constexprs.items()),
                sorted(self.attrs.items()),
                self.options,
            )
        )


def bind(variant: Variant, arch: int) -> Bound:
    """Triton's own launch-time specialization (``JITFunction.run``) applied to the variant's arguments."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = variant.kernel
    missing = set(kernel.arg_names) - set(variant.args)
    if missing:
        raise ValueError(f"{variant.kernel_name} {variant.label}: arguments {sorted(missing)} not given")
    backend = make_backend(GPUTarget("cuda", arch, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = {**variant.args, **variant.options}
    bound_args, specialization, options = binder(**kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, options)
    return Bound(kernel, [variant.label], signature, constexprs, attrs, options, variant.fp8_kv)


def ptxas_usage(ptx: str, arch: int, options) -> dict:
    """Registers, spills and stack of the kernel in ``ptx``, from ``ptxas -v`` run as Triton runs it."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        cmd = [
            get_ptxas(arch).path,
            "-lineinfo",
            "-v",
            "--regAllocOptLevel=2",
            *([] if options.enable_fp_fusion else ["--fmad=false"]),
            f"--gpu-name={sm_arch_from_capability(arch)}",
            str(src),
            "-o",
            str(Path(tmp) / "kernel.cubin"),
        ]
        log = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
    return parse_ptxas_log(log)


def parse_ptxas_log(log: str) -> dict:
    """The entry function's numbers from a ``ptxas -v`` log (the largest, should there be several)."""

    def largest(pattern: str) -> int:
        return max((int(v) for v in re.findall(pattern, log)), default=0)

    registers = re.findall(r"Used (\d+) registers", log)
    if not registers:
        raise ValueError(f"no register count in the ptxas log:\n{log}")
    return dict(
        registers=max(map(int, registers)),
        spill_stores=largest(r"(\d+) bytes spill stores"),
        spill_loads=largest(r"(\d+) bytes spill loads"),
        stack=largest(r"(\d+) bytes stack frame"),
    )


def compile_one(bound: Bound, arch: int) -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    row = dict(
        kernel=bound.kernel.fn.__name__,
        module=bound.kernel.fn.__module__,
        variant=" | ".join(bound.labels),
        arch=arch,
        num_warps=bound.options.num_warps,
        num_stages=bound.options.num_stages,
        shared_limit=SHARED_LIMIT[arch],
        registers=None,
        shared=None,
        spill_stores=None,
        spill_loads=None,
        stack=None,
        ok=False,
        result="failed",
        why="",
        fp8_kv=bound.fp8_kv,
    )
    start = time.perf_counter()
    try:
        src = ASTSource(bound.kernel, bound.signature, bound.constexprs, bound.attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=bound.options.__dict__)
        row["shared"] = compiled.metadata.shared
        row.update(ptxas_usage(compiled.asm["ptx"], arch, bound.options))
    except Exception as e:  # a kernel that does not compile is a result, not a crash
        message = getattr(e, "error_message", None) or str(e)  # CompilationError: without the kernel's source
        lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
        row["why"] = f"does not compile: {type(e).__name__}: {' / '.join(lines[:3])[:400]}"
    row["seconds"] = round(time.perf_counter() - start, 2)
    if row["registers"] is not None:
        problems = []
        if row["spill_stores"] or row["spill_loads"]:
            problems.append(f"spills {row['spill_stores']} B stored / {row['spill_loads']} B loaded")
        if row["shared"] > row["shared_limit"]:
            problems.append(f"shared memory {row['shared']} B > {row['shared_limit']} B")
        row["ok"], row["why"] = not problems, "; ".join(problems)
        row["result"] = "ok" if row["ok"] else "failed"
    return row


def refused_row(variant: Variant, arch: int, why: str) -> dict:
    """A variant the engine never launches on ``arch``: it refuses the configuration at start-up."""
    return dict(
        kernel=variant.kernel_name,
        module=variant.kernel.fn.__module__,
        variant=variant.label,
        arch=arch,
        num_warps=variant.options.get("num_warps"),
        num_stages=variant.options.get("num_stages"),
        shared_limit=SHARED_LIMIT[arch],
        registers=None,
        shared=None,
        spill_stores=None,
        spill_loads=None,
        stack=None,
        ok=False,
        result="refused",
        why=why,
        fp8_kv=variant.fp8_kv,
        seconds=0.0,
    )


def bound_variants(variants: list[Variant], arch: int) -> list[Bound]:
    """The variants bound for ``arch``, those that compile to the same kernel merged."""
    merged: dict[str, Bound] = {}
    for v in variants:
        b = bind(v, arch)
        if b.key() in merged:
            merged[b.key()].labels.append(v.label)
            merged[b.key()].fp8_kv |= b.fp8_kv
        else:
            merged[b.key()] = b
    return list(merged.values())


_JOBS: list[tuple[Bound, int]] = []  # inherited by forked workers


def _run_job(i: int) -> dict:
    return compile_one(*_JOBS[i])


def report(
    archs: tuple[int, ...] = ARCHS, jobs: int = 1, variants: Callable[[int], list[Variant]] = all_variants
) -> list[dict]:
    """A row per compiled kernel (variants merged) and per refused variant, for each arch;
    ``variants(arch)`` gives the launches on that architecture."""
    _JOBS.clear()
    refused = []
    for arch in archs:
        launched = []
        for v in variants(arch):
            why = start_up_refusal(v, arch)
            if why:
                refused.append(refused_row(v, arch, why))
            else:
                launched.append(v)
        _JOBS.extend((b, arch) for b in bound_variants(launched, arch))
    order = list(range(len(_JOBS)))
    if jobs <= 1:
        return [_run_job(i) for i in order] + refused
    # Attention kernels take longest: start them first so that the two workers end together.
    order.sort(key=lambda i: _JOBS[i][0].kernel.fn.__name__ != "_paged_attention_kernel")
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        rows = dict(zip(order, pool.map(_run_job, order, chunksize=1)))
    return [rows[i] for i in range(len(_JOBS))] + refused


def format_table(rows: list[dict]) -> str:
    head = ("kernel", "variant", "sm", "warps", "stages", "regs", "shared B", "limit B", "spill st/ld B", "s", "result")
    outcome = {
        "ok": lambda r: "ok",
        "failed": lambda r: f"FAIL: {r['why']}",
        "refused": lambda r: f"refused at start-up: {r['why']}",
    }
    body = [
        (
            r["kernel"],
            r["variant"],
            str(r["arch"]),
            str(r["num_warps"] or "-"),
            str(r["num_stages"] or "-"),
            "-" if r["registers"] is None else str(r["registers"]),
            "-" if r["shared"] is None else str(r["shared"]),
            str(r["shared_limit"]),
            "-" if r["spill_stores"] is None else f"{r['spill_stores']}/{r['spill_loads']}",
            f"{r['seconds']:.1f}",
            outcome[r["result"]](r),
        )
        for r in sorted(rows, key=lambda r: (r["kernel"], r["variant"], r["arch"]))
    ]
    widths = [max(len(row[i]) for row in (head, *body)) for i in range(len(head) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in (head, *body)]
    count = {result: sum(r["result"] == result for r in rows) for result in outcome}
    lines.append(
        f"{len(rows) - count['refused']} compiled variants, {count['failed']} failed; "
        f"{count['refused']} refused at start-up (not compiled)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--arch",
        type=int,
        nargs="+",
        default=list(ARCHS),
        choices=sorted(SHARED_LIMIT),
        help="compute capabilities to compile for",
    )
    p.add_argument("--json", metavar="PATH", help="also write the rows here")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="compiles in parallel")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("unset TRITON_INTERPRET: the kernels must be compiled, not interpreted")
    start = time.perf_counter()
    rows = report(tuple(args.arch), args.jobs)
    print(format_table(rows))
    print(f"{time.perf_counter() - start:.1f} s with {args.jobs} job(s)")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(shared_limit=SHARED_LIMIT, rows=rows), indent=1) + "\n")
    return 1 if any(r["result"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
