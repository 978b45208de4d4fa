"""Triton kernels for the small per-token ops (used on CUDA; the torch layers are the reference)."""
