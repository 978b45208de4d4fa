"""Helpers of tools/gpu_session.sh: the stages' checks and metrics, and the session summary."""
