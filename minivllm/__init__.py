"""minivllm: a small LLM inference engine with vLLM's architecture, configured with Hydra.

The names below are imported on first use (as vLLM does), so that importing one
part, ``minivllm.config`` say, does not import the whole engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minivllm.config import VllmConfig, compose
    from minivllm.entrypoints.llm import LLM
    from minivllm.inputs import TextPrompt, TokensPrompt
    from minivllm.models.registry import ModelRegistry
    from minivllm.outputs import CompletionOutput, EmbeddingRequestOutput, PoolingRequestOutput, RequestOutput
    from minivllm.pooling.params import PoolingParams
    from minivllm.sampling_params import RequestOutputKind, SamplingParams

_LAZY = {
    "LLM": "minivllm.entrypoints.llm",
    "CompletionOutput": "minivllm.outputs",
    "EmbeddingRequestOutput": "minivllm.outputs",
    "ModelRegistry": "minivllm.models.registry",
    "PoolingParams": "minivllm.pooling.params",
    "PoolingRequestOutput": "minivllm.outputs",
    "RequestOutput": "minivllm.outputs",
    "RequestOutputKind": "minivllm.sampling_params",
    "SamplingParams": "minivllm.sampling_params",
    "TextPrompt": "minivllm.inputs",
    "TokensPrompt": "minivllm.inputs",
    "VllmConfig": "minivllm.config",
    "compose": "minivllm.config",
}

__all__ = [
    "LLM",
    "CompletionOutput",
    "EmbeddingRequestOutput",
    "ModelRegistry",
    "PoolingParams",
    "PoolingRequestOutput",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "TextPrompt",
    "TokensPrompt",
    "VllmConfig",
    "compose",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'minivllm' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
