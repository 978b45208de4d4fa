"""Kernels for the small per-token ops: Triton on CUDA, C on the CPU (``cpu_fused``); the torch layers are the reference."""
