"""minivllm: a small LLM inference engine with vLLM's architecture, configured with Hydra."""
from minivllm.config import VllmConfig, compose
from minivllm.engine.outputs import CompletionOutput, RequestOutput
from minivllm.entrypoints.llm import LLM
from minivllm.models.registry import ModelRegistry
from minivllm.sampling_params import RequestOutputKind, SamplingParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "ModelRegistry",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "VllmConfig",
    "compose",
]
__version__ = "0.1.0"
