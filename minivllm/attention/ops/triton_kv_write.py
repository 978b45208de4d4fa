"""Triton kernel that stores a step's new keys and values in the paged KV cache
(or, ``KEY_ONLY``, an MLA layer's latents in its latent cache: ``write_latent``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.attention.kv_quant import FP8_KV_DTYPE
from minivllm.attention.ops.checks import (
    SUPPORTED_DTYPES,
    check_cache,
    check_launchable,
    check_tensor,
    is_interpreted,
    require,
)

FP8_MAX = tl.constexpr(448.0)  # largest float8_e4m3fn value


@triton.jit
def _round_to_e4m3(x):
    """fp32 ``x`` (within +-448) rounded to the nearest-even float8_e4m3fn value, kept in fp32.

    The Triton interpreter's fp8 cast truncates and drops the carry into the
    exponent (126.9 becomes 64, not 128); casting an already representable
    value is exact there. Normal e4m3 values keep 3 mantissa bits (20 of fp32's
    23 are cut); below 2**-6 they are multiples of 2**-9, which adding and
    subtracting 1.5 * 2**14 rounds to (on the magnitude, so -0.0 keeps its sign)."""
    bits = x.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    magnitude = (tl.abs(x) + 24576.0) - 24576.0
    subnormal = tl.where((bits >> 31) != 0, -magnitude, magnitude)  # the sign bit: -0.0 too
    return tl.where(tl.abs(x) < 0.015625, subnormal, normal)


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,  # (T, Hkv, D)
    kv_ptr,  # (2, num_blocks, block_size, Hkv, D)
    slot_mapping_ptr,  # (T,)
    k_scale,
    v_scale,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kv,
    stride_cb,
    stride_cs,
    stride_ch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    FP8: tl.constexpr,
    ROUND_FP8: tl.constexpr,
    KEY_ONLY: tl.constexpr = False,
):
    """One program per token: copy all of its KV heads into its slot (an fp8 cache
    stores them divided by their scale, clamped to e4m3's range). ``KEY_ONLY``: no
    values (an MLA latent cache, one "head" per token; ``value_ptr`` is not read)."""
    t = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:  # padding token
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
    dst = kv_ptr + (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + h * stride_ch + d
    k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    if FP8:
        k = tl.clamp(k.to(tl.float32) / k_scale, -FP8_MAX, FP8_MAX)
        if ROUND_FP8:
            k = _round_to_e4m3(k)
    tl.store(dst, k.to(kv_ptr.dtype.element_ty), mask=mask)
    if not KEY_ONLY:
        v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
        if FP8:
            v = tl.clamp(v.to(tl.float32) / v_scale, -FP8_MAX, FP8_MAX)
            if ROUND_FP8:
                v = _round_to_e4m3(v)
        tl.store(dst + stride_kv, v.to(kv_ptr.dtype.element_ty), mask=mask)


def launch_constexprs(
    num_kv_heads: int, head_dim: int, block_size: int, fp8: bool, round_fp8: bool, key_only: bool = False
) -> dict:
    """The kernel's compile-time arguments: a program holds all KV heads of one token
    (also read by ``tools/kernel_report.py``)."""
    return dict(
        KEY_ONLY=key_only,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
        FP8=fp8,
        ROUND_FP8=round_fp8,
    )


def write_kv(
    key: torch.Tensor,  # (T, Hkv, D)
    value: torch.Tensor,  # (T, Hkv, D)
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hkv, D)
    slot_mapping: torch.Tensor,  # (T,) int64; < 0 means padding, not written
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Store each token's key and value at its slot ``block_id * block_size + offset``.

    A float8_e4m3fn cache stores ``key / k_scale`` and ``value / v_scale`` (see
    ``attention/kv_quant.py``); other caches must have the inputs' dtype.

    ``key``/``value`` may be strided views (e.g. slices of a fused qkv output)
    as long as their last dim is contiguous.
    """
    device = key.device
    check_launchable(device, _write_kv_kernel)
    check_tensor(key, "key", device, dims=3)
    check_tensor(value, "value", device, dims=3)
    check_tensor(slot_mapping, "slot_mapping", device, dims=1)
    num_tokens, num_kv_heads, head_dim = key.shape
    require(value.shape == key.shape, f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}")
    require(
        key.dtype in SUPPORTED_DTYPES and value.dtype == key.dtype,
        f"key/value dtypes must match and be one of {SUPPORTED_DTYPES}, got {key.dtype}/{value.dtype}",
    )
    check_cache(kv_cache, device, key.dtype, num_kv_heads, head_dim)
    require(k_scale > 0 and v_scale > 0, f"k_scale/v_scale must be > 0, got {k_scale}/{v_scale}")
    require(
        slot_mapping.shape[0] == num_tokens and slot_mapping.dtype in (torch.int32, torch.int64),
        f"slot_mapping must be ({num_tokens},) int64, got {tuple(slot_mapping.shape)} {slot_mapping.dtype}",
    )
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        kv_cache,
        slot_mapping,
        float(k_scale),
        float(v_scale),
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        *kv_cache.stride()[:4],
        **launch_constexprs(
            num_kv_heads, head_dim, kv_cache.shape[2], kv_cache.dtype == FP8_KV_DTYPE, is_interpreted(_write_kv_kernel)
        ),
    )


def write_latent(
    latent: torch.Tensor,  # (T, W): an MLA layer's new [c ; k_pe] rows
    kv_cache: torch.Tensor,  # (num_blocks, block_size, 1, W)
    slot_mapping: torch.Tensor,  # (T,) int64; < 0 means padding, not written
    k_scale: float = 1.0,
) -> None:
    """``attention/mla.py``'s ``write_latent`` in one launch, with nothing read back on the host
    (the padding test is per program), so a CUDA graph can capture it. An fp8 cache stores
    ``latent / k_scale``."""
    device = latent.device
    check_launchable(device, _write_kv_kernel)
    check_tensor(latent, "latent", device, dims=2)
    check_tensor(kv_cache, "kv_cache", device, dims=4)
    check_tensor(slot_mapping, "slot_mapping", device, dims=1)
    num_tokens, width = latent.shape
    require(
        kv_cache.shape[2:] == (1, width) and kv_cache.is_contiguous(),
        f"kv_cache must be a contiguous (num_blocks, block_size, 1, {width}) latent cache, got {tuple(kv_cache.shape)}",
    )
    require(
        latent.dtype in SUPPORTED_DTYPES and kv_cache.dtype in (latent.dtype, FP8_KV_DTYPE),
        f"latent dtype {latent.dtype} / cache dtype {kv_cache.dtype} unsupported",
    )
    require(k_scale > 0, f"k_scale must be > 0, got {k_scale}")
    require(
        slot_mapping.shape[0] == num_tokens, f"slot_mapping must be ({num_tokens},), got {tuple(slot_mapping.shape)}"
    )
    if num_tokens == 0:
        return
    fp8 = kv_cache.dtype == FP8_KV_DTYPE
    _write_kv_kernel[(num_tokens,)](
        latent,
        latent,
        kv_cache,
        slot_mapping,
        float(k_scale),
        1.0,
        latent.stride(0),
        0,
        latent.stride(0),
        0,
        0,
        *kv_cache.stride()[:3],
        **launch_constexprs(1, width, kv_cache.shape[1], fp8, is_interpreted(_write_kv_kernel), key_only=True),
    )
