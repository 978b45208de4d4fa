"""The config tree: schemas, the root VllmConfig, Hydra composition, vLLM's ``LLM(...)`` keywords.

The config describes; it never builds. This package imports nothing from the
engine's packages (core, engine, executor, worker, models, layers, ...), only the
standard library, torch, transformers, Hydra/OmegaConf and ``minivllm.utils``;
what needs the model itself comes back from the worker that loaded it
(``minivllm/kv_cache_spec.py``). ``tests/config/test_config_is_a_leaf.py`` keeps it so.
"""

from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.schema import (
    AttentionConfig,
    CacheConfig,
    CompilationConfig,
    DeviceConfig,
    LoadConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    TaskConfig,
)
from minivllm.config.store import build_config, compose, register_configs
from minivllm.config.vllm_config import ServeConfig, VllmConfig

__all__ = [
    "AttentionConfig",
    "CacheConfig",
    "CompilationConfig",
    "DeviceConfig",
    "LoadConfig",
    "ModelConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "ServeConfig",
    "TaskConfig",
    "VllmConfig",
    "build_config",
    "config_from_kwargs",
    "compose",
    "register_configs",
]
