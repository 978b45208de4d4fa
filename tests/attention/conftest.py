"""Without a CUDA device, run Triton kernels through Triton's interpreter.

Triton reads ``TRITON_INTERPRET`` when a kernel is defined, so this must run
before ``minivllm.attention.ops`` is imported; conftest files load first.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
