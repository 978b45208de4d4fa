"""The float8_e4m3fn numbers shared by fp8 linears (``fp8.py``) and their Triton
activation quantization (``triton_fp8_quant.py``), which import each other's nothing."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
FP8_MIN_SCALE = 1e-12
"""A dynamic activation scale's floor: a row of zeros is divided by it."""
FP8_GEMM_MIN_CAPABILITY = (8, 9)
"""fp8 tensor cores (Ada, Hopper and newer), and Triton's float8_e4m3fn."""
