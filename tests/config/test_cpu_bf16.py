"""bf16 weights on the CPU: allowed where the CPU computes in bf16 natively, refused naming the key elsewhere."""

from __future__ import annotations

import pytest
import torch

from minivllm.config import model as model_config
from minivllm.config.model import cpu_has_native_bf16, resolve_dtype

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c\n"
AVX512_BF16 = "flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx2 avx512f amx_bf16 amx_tile\n"
ARM = "Features\t: fp asimd bf16 i8mm\n"


@pytest.mark.parametrize(
    "cpuinfo, native", [(AVX2_ONLY, False), (AVX512_BF16, True), (SAPPHIRE_RAPIDS, True), (ARM, True), ("", True)]
)
def test_native_bf16_from_the_cpu_flags(cpuinfo, native):
    assert cpu_has_native_bf16(cpuinfo) is native


def test_bf16_on_a_cpu_without_it_is_refused_naming_the_key(monkeypatch):
    monkeypatch.setattr(model_config, "cpu_has_native_bf16", lambda: False)
    with pytest.raises(ValueError, match="model.dtype=bfloat16: this CPU has no native bf16.*model.dtype=float32"):
        resolve_dtype("bfloat16", None, "cpu")
    assert resolve_dtype("bfloat16", None, "cuda") == torch.bfloat16  # a GPU's matter, not the host's
    assert resolve_dtype("float32", None, "cpu") == torch.float32


def test_bf16_on_a_cpu_with_it_is_kept(monkeypatch):
    monkeypatch.setattr(model_config, "cpu_has_native_bf16", lambda: True)
    assert resolve_dtype("bfloat16", None, "cpu") == torch.bfloat16
