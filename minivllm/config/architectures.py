"""The architectures this engine runs: config.json ``architectures`` names and where each model class lives.

The table is data (``"package.module:ClassName"``, or a class registered by an
out-of-tree package), so a config can refuse an unknown architecture when it is
built without importing a model. ``models/registry.py``'s ``ModelRegistry``
reads and writes the same dict, ``ARCHITECTURES``, and imports the class a name
stands for when the loader asks.
"""

from __future__ import annotations

from typing import Any

ARCHITECTURES: dict[str, Any] = {
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
    # vision-language models (images in the prompt: minivllm/multimodal/)
    "LlavaForConditionalGeneration": "minivllm.models.llava:LlavaForConditionalGeneration",
    "Qwen2VLForConditionalGeneration": "minivllm.models.qwen2_vl:Qwen2VLForConditionalGeneration",
    # decoder-only base models (no LM head): model.runner=pooling only
    "LlamaModel": "minivllm.pooling.base_models:LlamaBaseModel",
    "Qwen2Model": "minivllm.pooling.base_models:Qwen2BaseModel",
    "Qwen3Model": "minivllm.pooling.base_models:Qwen3BaseModel",
    "MistralModel": "minivllm.pooling.base_models:MistralBaseModel",
}
"""Architecture name -> its model class, as ``"package.module:ClassName"`` or the class itself.
One dict per process, shared by every ``ArchitectureTable`` (registrations included)."""
POOLING_ONLY = frozenset({"LlamaModel", "Qwen2Model", "Qwen3Model", "MistralModel"})
"""Architectures without an LM head: they can only embed."""


class ArchitectureTable:
    """Names, registration and the supported-check over a shared architecture dict."""

    def __init__(self, models: dict[str, Any]) -> None:
        self._models = models
        """Not a copy: the config's check sees what ``ModelRegistry`` registers."""

    def register_model(self, architecture: str, model: Any) -> None:
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


SUPPORTED_ARCHITECTURES = ArchitectureTable(ARCHITECTURES)
"""What ``VllmConfig`` checks ``architectures[0]`` (or ``model.architecture``) against."""
