"""Tensor-parallel process group helpers."""
