"""Attention backends: how a layer's queries meet the paged KV cache."""

from minivllm.attention.backend import AttentionBackend, AttentionMetadata

__all__ = ["AttentionBackend", "AttentionMetadata"]
