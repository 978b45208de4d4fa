"""Kernels behind the attention backends."""
from minivllm.attention.ops.triton_paged_attention import paged_attention, write_kv

__all__ = ["paged_attention", "write_kv"]
