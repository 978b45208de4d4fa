"""Test-side quantizers following the published checkpoint layouts, written
independently of minivllm/quantization (numpy bit packing, no shared helpers).

Each ``write_*`` reads a plain fp32 checkpoint and writes two: the quantized one
(what a user downloads, with config.json's ``quantization_config``) and a plain
one holding the DEQUANTIZED weights, on which transformers is the reference.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i of a packed int32 holds column 8c + AWQ_ORDER[i]
FP8_MAX = 448.0

Quantizer = Callable[[str, torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]]
"""(tensor name prefix, fp32 (out, in) weight) -> (checkpoint tensors, dequantized (out, in) weight)."""


def write_pair(src: Path, out: Path, quantizer: Quantizer, quant_config: dict) -> tuple[Path, Path]:
    """``out/quant`` (quantized, with ``quant_config``) and ``out/dequant`` (plain fp32)."""
    state = load_file(src / "model.safetensors")
    quant, dequant = {}, {}
    for name, tensor in state.items():
        prefix = name.removesuffix(".weight")
        if name.endswith(".weight") and prefix.rsplit(".", 1)[-1] in LINEARS:
            tensors, real = quantizer(prefix, tensor.float())
            quant.update(tensors)
            dequant[name] = real.contiguous()
        else:
            quant[name] = dequant[name] = tensor
    q_dir, d_dir = _copy_dir(src, out / "quant"), _copy_dir(src, out / "dequant")
    save_file(quant, q_dir / "model.safetensors")
    save_file(dequant, d_dir / "model.safetensors")
    config = json.loads((q_dir / "config.json").read_text())
    config["quantization_config"] = quant_config
    (q_dir / "config.json").write_text(json.dumps(config))
    return q_dir, d_dir


def _copy_dir(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    return dst


# ---- fp8 / int8: (out, in) weight times a scale per tensor or per output row -------------


def fp8_quantizer(per_channel: bool, input_scale: bool, scale_shape: str = "scalar") -> Quantizer:
    """``scale_shape`` "scalar" writes per-tensor scales as 0-d tensors (vLLM fp8),
    "one" as shape (1,) (compressed-tensors); per-channel scales are (out, 1)."""

    def quantize(prefix: str, w: torch.Tensor):
        amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax()
        scale = (amax / FP8_MAX).float()
        q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        real = q.float() * scale
        if not per_channel:
            scale = scale.reshape(()) if scale_shape == "scalar" else scale.reshape(1)
        tensors = {f"{prefix}.weight": q, f"{prefix}.weight_scale": scale}
        if input_scale:  # any positive value: the CPU path does not quantize activations
            tensors[f"{prefix}.input_scale"] = torch.tensor([0.01 + 0.001 * len(prefix)])
        return tensors, real

    return quantize


def int8_channel_quantizer(prefix: str, w: torch.Tensor):
    scale = w.abs().amax(dim=1, keepdim=True) / 127.0  # (out, 1)
    q = torch.round(w / scale).clamp(-128, 127).to(torch.int8)
    return {f"{prefix}.weight": q, f"{prefix}.weight_scale": scale}, q.float() * scale


def ct_packed_quantizer(bits: int, group: int | None) -> Quantizer:
    """compressed-tensors pack-quantized: symmetric, q + 2^(bits-1) in consecutive bit fields
    of int32 words along the input; ``group`` None: one scale per output channel."""
    qmax, per_word = 2 ** (bits - 1) - 1, 32 // bits

    def quantize(prefix: str, w: torch.Tensor):
        out, k = w.shape
        size = group or k
        scale = (w.reshape(out, k // size, size).abs().amax(-1) / qmax).half()  # (out, groups)
        full = scale.float().repeat_interleave(size, dim=1)  # (out, k)
        q = torch.round(w / full).clamp(-qmax - 1, qmax).long()
        fields = (q + qmax + 1).numpy().astype(np.uint32).reshape(out, k // per_word, per_word)
        packed = np.zeros(fields.shape[:2], dtype=np.uint32)
        for i in range(per_word):
            packed |= fields[:, :, i] << np.uint32(bits * i)
        tensors = {
            f"{prefix}.weight_packed": torch.from_numpy(packed.view(np.int32).copy()),
            f"{prefix}.weight_scale": scale if group else scale.float(),
            f"{prefix}.weight_shape": torch.tensor([out, k]),
        }
        return tensors, q.float() * full

    return quantize


# ---- int4 with groups along the input features ----------------------------------------------


def _int4_groups(w_kn: torch.Tensor, groups: np.ndarray, num_groups: int, zero_low: int):
    """Asymmetric 4-bit per (group, column): q (K, N), zeros (G, N), fp16 scales (G, N), real (K, N)."""
    k, n = w_kn.shape
    scales, zeros = torch.zeros(num_groups, n, dtype=torch.float16), torch.zeros(num_groups, n, dtype=torch.int64)
    for g in range(num_groups):
        rows = w_kn[torch.from_numpy(groups == g)]
        lo, hi = rows.amin(0).clamp(max=0), rows.amax(0).clamp(min=0)
        scales[g] = ((hi - lo) / 15).clamp(min=1e-4).half()
        zeros[g] = torch.round(-lo / scales[g].float()).clamp(zero_low, 15).long()
    gi = torch.from_numpy(groups).long()
    q = torch.round(w_kn / scales[gi].float() + zeros[gi]).clamp(0, 15).long()
    real = (q - zeros[gi]).float() * scales[gi].float()
    return q, zeros, scales, real


def _pack_along_last(values: torch.Tensor, order: list[int]) -> torch.Tensor:
    v = values.numpy().astype(np.uint32)
    v = v.reshape(v.shape[0], -1, 8)
    packed = np.zeros(v.shape[:2], dtype=np.uint32)
    for i in range(8):
        packed |= v[:, :, order[i]] << np.uint32(4 * i)
    return torch.from_numpy(packed.view(np.int32).copy())


def _pack_along_first(values: torch.Tensor) -> torch.Tensor:
    v = values.numpy().astype(np.uint32)
    v = v.reshape(-1, 8, v.shape[1])
    packed = np.zeros((v.shape[0], v.shape[2]), dtype=np.uint32)
    for i in range(8):
        packed |= v[:, i, :] << np.uint32(4 * i)
    return torch.from_numpy(packed.view(np.int32).copy())


def awq_quantizer(group: int) -> Quantizer:
    def quantize(prefix: str, w: torch.Tensor):
        w_kn = w.t().contiguous()  # AWQ stores (in, out)
        k = w_kn.shape[0]
        q, zeros, scales, real = _int4_groups(w_kn, np.arange(k) // group, k // group, zero_low=0)
        tensors = {
            f"{prefix}.qweight": _pack_along_last(q, AWQ_ORDER),
            f"{prefix}.qzeros": _pack_along_last(zeros, AWQ_ORDER),
            f"{prefix}.scales": scales,
        }
        return tensors, real.t()

    return quantize


def gptq_quantizer(group: int, desc_act: bool, seed: int = 0) -> Quantizer:
    """GPTQ v1: qzeros store zero - 1, so zeros are kept in 1..15 (the format cannot hold 0)."""

    def quantize(prefix: str, w: torch.Tensor):
        w_kn = w.t().contiguous()
        k = w_kn.shape[0]
        groups = np.arange(k) // group
        if desc_act:  # act-order: rows visited in a permuted order, groups follow the visit order
            perm = np.random.default_rng(seed + _input_key(prefix)).permutation(k)
            groups = np.empty(k, dtype=np.int64)
            groups[perm] = np.arange(k) // group
        q, zeros, scales, real = _int4_groups(w_kn, groups, k // group, zero_low=1)
        tensors = {
            f"{prefix}.qweight": _pack_along_first(q),
            f"{prefix}.qzeros": _pack_along_last(zeros - 1, list(range(8))),
            f"{prefix}.scales": scales,
            f"{prefix}.g_idx": torch.from_numpy(groups.astype(np.int32)),
        }
        return tensors, real.t()

    return quantize


def _input_key(prefix: str) -> int:
    """Layers reading the same input (q/k/v, gate/up) share GPTQ's act-order permutation."""
    parent, leaf = prefix.rsplit(".", 1)
    role = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}.get(leaf, leaf)
    return sum(ord(c) for c in f"{parent}.{role}")
