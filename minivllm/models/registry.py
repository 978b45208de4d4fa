"""Maps config.json ``architectures`` names to model classes, imported lazily.

The names live with the config (``minivllm/config/model.py``), so that a
config is checked without importing any model; ``ModelRegistry`` works on the
same dict and adds ``resolve``, which imports the class. Out-of-tree models
register themselves::

    ModelRegistry.register_model("MyForCausalLM", "my_pkg.my_model:MyForCausalLM")
"""

from __future__ import annotations

import importlib

from torch import nn

from minivllm.config.model import ARCHITECTURES, POOLING_ONLY, ArchitectureTable

__all__ = ["ModelRegistry", "POOLING_ONLY"]


class _Registry(ArchitectureTable):
    def resolve(self, architecture: str) -> type[nn.Module]:
        self.check_supported(architecture)
        entry = self._models[architecture]
        if isinstance(entry, str):
            module_name, class_name = entry.split(":")
            entry = getattr(importlib.import_module(module_name), class_name)
            self._models[architecture] = entry
        return entry


ModelRegistry = _Registry(ARCHITECTURES)


def check_pipeline_parallel(architecture: str, pp: int) -> None:
    """``parallel.pp > 1`` needs a model class that builds only its stage's layers (``supports_pp``).
    The config cannot look at classes, so the engine calls this before any worker starts."""
    if pp > 1 and not getattr(ModelRegistry.resolve(architecture), "supports_pp", False):
        raise ValueError(f"parallel.pp={pp}: {architecture} does not support pipeline parallelism; use 1")
