"""Maps config.json ``architectures`` names to model classes, imported lazily.

Out-of-tree models register themselves::

    ModelRegistry.register_model("MyForCausalLM", "my_pkg.my_model:MyForCausalLM")
"""
from __future__ import annotations

import importlib

from torch import nn

_BUILTIN: dict[str, str] = {
    "OPTForCausalLM": "minivllm.models.opt:OPTForCausalLM",
    "LlamaForCausalLM": "minivllm.models.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "minivllm.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "minivllm.models.qwen3:Qwen3ForCausalLM",
    "MistralForCausalLM": "minivllm.models.mistral:MistralForCausalLM",
    "MixtralForCausalLM": "minivllm.models.mixtral:MixtralForCausalLM",
    "Qwen3MoeForCausalLM": "minivllm.models.qwen3_moe:Qwen3MoeForCausalLM",
    "Phi3ForCausalLM": "minivllm.models.phi3:Phi3ForCausalLM",
    "Gemma2ForCausalLM": "minivllm.models.gemma2:Gemma2ForCausalLM",
    "Gemma3ForCausalLM": "minivllm.models.gemma3:Gemma3ForCausalLM",
    "Olmo2ForCausalLM": "minivllm.models.olmo2:Olmo2ForCausalLM",
    "GraniteForCausalLM": "minivllm.models.granite:GraniteForCausalLM",
    "GPT2LMHeadModel": "minivllm.models.gpt2:GPT2LMHeadModel",
    "GPTNeoXForCausalLM": "minivllm.models.gpt_neox:GPTNeoXForCausalLM",
    # decoder-only base models (no LM head): model.runner=pooling only
    "LlamaModel": "minivllm.pooling.base_models:LlamaBaseModel",
    "Qwen2Model": "minivllm.pooling.base_models:Qwen2BaseModel",
    "Qwen3Model": "minivllm.pooling.base_models:Qwen3BaseModel",
    "MistralModel": "minivllm.pooling.base_models:MistralBaseModel",
}
POOLING_ONLY = frozenset({"LlamaModel", "Qwen2Model", "Qwen3Model", "MistralModel"})
"""Architectures without an LM head: they can only embed."""


class _Registry:
    def __init__(self, models: dict[str, str]) -> None:
        self._models: dict[str, str | type[nn.Module]] = dict(models)

    def register_model(self, architecture: str, model: str | type[nn.Module]) -> None:
        """``model`` is a class or a ``"package.module:ClassName"`` string (imported on first use)."""
        if isinstance(model, str) and ":" not in model:
            raise ValueError(f"register_model({architecture!r}, {model!r}): expected 'package.module:ClassName'")
        self._models[architecture] = model

    def get_supported_archs(self) -> list[str]:
        return sorted(self._models)

    def is_supported(self, architecture: str) -> bool:
        return architecture in self._models

    def check_supported(self, architecture: str) -> None:
        """Raise a ValueError naming the supported architectures when ``architecture`` is not one."""
        if architecture not in self._models:
            raise ValueError(
                f"architecture {architecture!r} is not supported; supported are: "
                f"{', '.join(self.get_supported_archs())} (or register your own with "
                f"ModelRegistry.register_model, or set model.architecture)"
            )

    def resolve(self, architecture: str) -> type[nn.Module]:
        self.check_supported(architecture)
        entry = self._models[architecture]
        if isinstance(entry, str):
            module_name, class_name = entry.split(":")
            entry = getattr(importlib.import_module(module_name), class_name)
            self._models[architecture] = entry
        return entry


ModelRegistry = _Registry(_BUILTIN)
