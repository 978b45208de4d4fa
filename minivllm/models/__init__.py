"""Model families, picked by the checkpoint's config.json ``architectures``."""

from minivllm.models.registry import ModelRegistry

__all__ = ["ModelRegistry"]
