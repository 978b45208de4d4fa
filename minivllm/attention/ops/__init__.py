"""Kernels behind the attention backends."""

from minivllm.attention.ops.triton_kv_write import write_kv
from minivllm.attention.ops.triton_paged_attention import paged_attention

__all__ = ["paged_attention", "write_kv"]
